#!/usr/bin/env bash
# Create the poison-pill table on a local DynamoDB-protocol endpoint (moto's server, DynamoDB
# Local), with the schema the function expects and the SAM template declares:
#   partition key "pk" (S) only, on-demand billing (PAY_PER_REQUEST), TTL on "expires_at".
# The schema is defined once, in src/poison/dynamodb/mod.rs (PARTITION_KEY, TTL_ATTRIBUTE);
# tests/poison_dynamodb.rs runs this script and checks the table it creates against it.
#
# Usage: infra/create-local-table.sh ENDPOINT [TABLE]
#   ENDPOINT  e.g. http://127.0.0.1:5000 (a moto server: .venv/bin/moto_server -H 127.0.0.1 -p 5000)
#   TABLE     default: ironflow-poison
# Idempotent: an existing table with the right key schema is kept (TTL enabled if it is not);
# one with another key schema is an error. Needs the .venv that ./scripts/test installs (boto3
# comes with moto[server]). Dummy credentials and region are used unless AWS_* are set.
# Then run the function against it with:
#   IRONFLOW_POISON_TABLE=TABLE AWS_ENDPOINT_URL_DYNAMODB=ENDPOINT AWS_REGION=us-east-1 ...
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "no .venv: run ./scripts/test once (or: python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt)" >&2
  exit 1
fi
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-testing}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-testing}"
export AWS_DEFAULT_REGION="${AWS_REGION:-${AWS_DEFAULT_REGION:-us-east-1}}"
exec .venv/bin/python - "$1" "${2:-ironflow-poison}" <<'PY'
import sys

import boto3

PARTITION_KEY = "pk"        # src/poison/dynamodb/mod.rs PARTITION_KEY
TTL_ATTRIBUTE = "expires_at"  # src/poison/dynamodb/mod.rs TTL_ATTRIBUTE

endpoint, table = sys.argv[1], sys.argv[2]
ddb = boto3.client("dynamodb", endpoint_url=endpoint)
try:
    ddb.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": PARTITION_KEY, "AttributeType": "S"}],
        KeySchema=[{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.get_waiter("table_exists").wait(TableName=table)
    print(f"created table {table} on {endpoint}")
except ddb.exceptions.ResourceInUseException:
    desc = ddb.describe_table(TableName=table)["Table"]
    keys = [(k["AttributeName"], k["KeyType"]) for k in desc["KeySchema"]]
    if keys != [(PARTITION_KEY, "HASH")]:
        sys.exit(f"table {table} exists with another key schema: {keys}")
    print(f"table {table} already exists on {endpoint}")
ttl = ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING") or ttl.get("AttributeName") != TTL_ATTRIBUTE:
    ddb.update_time_to_live(
        TableName=table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )
print(f"TTL on {TTL_ATTRIBUTE}")
PY
