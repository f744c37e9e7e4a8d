#!/usr/bin/env python3
"""A local stand-in for the stack's data resources: moto's server on 127.0.0.1 with the poison-pill
table, the wake-up queue and its dead-letter queue created exactly as template.yaml declares them.

template.yaml is the one source of truth: every AWS::DynamoDB::Table and AWS::SQS::Queue in it is
created with its declared properties (parameters at their defaults), and the function's environment
variables that point at them (IRONFLOW_POISON_TABLE, IRONFLOW_WAKE_QUEUE_URL) are printed with the
local names. A property this script does not know how to create stops it with an error, so the
template cannot drift from what it creates.

    .venv/bin/python infra/local_stack.py up [--port 4566] [--worker-token TOKEN]
        start moto's server, create the resources (and, with --worker-token, a Secrets Manager
        secret holding the token), print `export` lines for the shell: eval "$(... up)"
    .venv/bin/python infra/local_stack.py down
        stop the server that `up` started
    .venv/bin/python infra/local_stack.py create --endpoint URL [--prefix NAME]
        create the resources in a running moto server; print what was created as JSON
        (tests/template.rs does this against the server ./scripts/test starts)

Needs the project's .venv (./scripts/test installs it: moto[server], boto3, PyYAML).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import yaml

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template.yaml"
STATE_DIR = ROOT / "target" / "local-stack"
STATE_FILE = STATE_DIR / "state.json"
REGION = "us-east-1"
# moto accepts any credentials; these keep the SDKs from looking for real ones.
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


class StackError(Exception):
    """The template holds something this script cannot reproduce locally, or moto failed."""


# --- the template ------------------------------------------------------------------------------


def _tag_to_long_form(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    """CloudFormation's short tags (!Ref X, !GetAtt A.B, !Sub ...) in their long form."""
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if tag_suffix == "Ref":
        return {"Ref": value}
    if tag_suffix == "Condition":
        return {"Condition": value}
    if tag_suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{tag_suffix}": value}


class _TemplateLoader(yaml.SafeLoader):
    pass


_TemplateLoader.add_multi_constructor("!", _tag_to_long_form)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    """template.yaml as a dict, short tags expanded to their long form."""
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=_TemplateLoader)  # noqa: S506 - SafeLoader subclass


class Resolver:
    """Evaluates the intrinsic functions the data resources use, with parameters at their defaults."""

    def __init__(self, template: dict[str, Any], stack_name: str) -> None:
        self.template = template
        self.stack_name = stack_name
        # logical id -> {"Ref": ..., "Arn": ..., "QueueName": ...} once created
        self.created: dict[str, dict[str, str]] = {}

    def parameter(self, name: str) -> Any:
        params = self.template.get("Parameters", {})
        if name == "AWS::StackName":
            return self.stack_name
        if name == "AWS::Region":
            return REGION
        if name not in params or "Default" not in params[name]:
            raise StackError(f"parameter {name} has no default to use locally")
        return params[name]["Default"]

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            if key == "Ref":
                if arg in self.created:
                    return self.created[arg]["Ref"]
                if arg in self.template.get("Resources", {}):
                    raise StackError(f"Ref {arg}: that resource is not created locally")
                return self.parameter(arg)
            if key == "Fn::GetAtt":
                logical_id, attribute = arg
                try:
                    return self.created[logical_id][attribute]
                except KeyError:
                    raise StackError(f"GetAtt {logical_id}.{attribute} is not available locally") from None
            if key == "Fn::FindInMap":
                mapping, top, second = (self.resolve(a) for a in arg)
                return self.template["Mappings"][mapping][str(top)][second]
            if key == "Fn::Sub" and isinstance(arg, str):
                out = arg
                for name in ("AWS::StackName", "AWS::Region"):
                    out = out.replace("${" + name + "}", str(self.parameter(name)))
                if "${" in out:
                    raise StackError(f"Fn::Sub {arg!r}: only AWS::StackName and AWS::Region resolve locally")
                return out
            if key.startswith("Fn::") or key == "Condition":
                raise StackError(f"{key} is not supported by infra/local_stack.py")
        return {k: self.resolve(v) for k, v in value.items()}


# --- creating the resources -----------------------------------------------------------------------


def _only(props: dict[str, Any], known: set[str], logical_id: str) -> None:
    unknown = sorted(set(props) - known)
    if unknown:
        raise StackError(
            f"{logical_id}: infra/local_stack.py does not know how to create {', '.join(unknown)}; "
            "teach it, so that the local stack stays what the template declares"
        )


def create_table(client: Any, name: str, logical_id: str, props: dict[str, Any]) -> dict[str, str]:
    _only(
        props,
        {
            "BillingMode",
            "AttributeDefinitions",
            "KeySchema",
            "TimeToLiveSpecification",
            "SSESpecification",
            "PointInTimeRecoverySpecification",
        },
        logical_id,
    )
    request: dict[str, Any] = {
        "TableName": name,
        "KeySchema": props["KeySchema"],
        "AttributeDefinitions": props["AttributeDefinitions"],
        "BillingMode": props.get("BillingMode", "PROVISIONED"),
    }
    if "SSESpecification" in props:
        request["SSESpecification"] = {"Enabled": bool(props["SSESpecification"]["SSEEnabled"])}
    table = client.create_table(**request)["TableDescription"]
    client.get_waiter("table_exists").wait(TableName=name)
    if "TimeToLiveSpecification" in props:
        ttl = props["TimeToLiveSpecification"]
        client.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"AttributeName": ttl["AttributeName"], "Enabled": bool(ttl["Enabled"])},
        )
    if "PointInTimeRecoverySpecification" in props:
        pitr = props["PointInTimeRecoverySpecification"]
        client.update_continuous_backups(
            TableName=name,
            PointInTimeRecoverySpecification={
                "PointInTimeRecoveryEnabled": bool(pitr["PointInTimeRecoveryEnabled"])
            },
        )
    return {"Ref": name, "Arn": table["TableArn"]}


def create_queue(client: Any, name: str, logical_id: str, props: dict[str, Any]) -> dict[str, str]:
    _only(
        props,
        {"VisibilityTimeout", "MessageRetentionPeriod", "SqsManagedSseEnabled", "RedrivePolicy"},
        logical_id,
    )
    attributes: dict[str, str] = {}
    for key in ("VisibilityTimeout", "MessageRetentionPeriod"):
        if key in props:
            attributes[key] = str(props[key])
    if "SqsManagedSseEnabled" in props:
        attributes["SqsManagedSseEnabled"] = str(bool(props["SqsManagedSseEnabled"])).lower()
    if "RedrivePolicy" in props:
        redrive = props["RedrivePolicy"]
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": redrive["deadLetterTargetArn"],
                "maxReceiveCount": int(redrive["maxReceiveCount"]),
            }
        )
    url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return {"Ref": url, "Arn": arn, "QueueName": name}


def _dependencies(value: Any) -> set[str]:
    if isinstance(value, list):
        return set().union(*(_dependencies(v) for v in value)) if value else set()
    if isinstance(value, dict):
        deps: set[str] = set()
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                deps.add(arg)
            elif key == "Fn::GetAtt":
                deps.add(arg[0])
            else:
                deps |= _dependencies(arg)
        return deps
    return set()


CREATORS = {"AWS::DynamoDB::Table": ("dynamodb", create_table), "AWS::SQS::Queue": ("sqs", create_queue)}


def create_resources(endpoint: str, prefix: str, template: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create every table and queue of the template in the server at `endpoint`, named
    `<prefix>-<LogicalId>`. Returns what was created and the function's environment variables
    that point at it."""
    template = template or load_template()
    resolver = Resolver(template, stack_name=prefix)
    resources = template["Resources"]
    pending = {lid: r for lid, r in resources.items() if r["Type"] in CREATORS}
    clients: dict[str, Any] = {}
    while pending:
        ready = [lid for lid, r in pending.items() if not (_dependencies(r.get("Properties", {})) & set(pending))]
        if not ready:
            raise StackError(f"circular references between {sorted(pending)}")
        for logical_id in sorted(ready):
            resource = pending.pop(logical_id)
            service, create = CREATORS[resource["Type"]]
            if service not in clients:
                clients[service] = boto3.client(service, endpoint_url=endpoint, region_name=REGION, **CREDENTIALS)
            props = resolver.resolve(resource.get("Properties", {}))
            resolver.created[logical_id] = create(clients[service], f"{prefix}-{logical_id}", logical_id, props)

    environment: dict[str, str] = {}
    for resource in resources.values():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        variables = resource["Properties"].get("Environment", {}).get("Variables", {})
        for name, value in variables.items():
            if _dependencies(value) and _dependencies(value) <= set(resolver.created):
                environment[name] = resolver.resolve(value)
    return {"endpoint": endpoint, "region": REGION, "resources": resolver.created, "environment": environment}


# --- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(endpoint: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"moto's server exited with {process.returncode}; see {log}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=1)  # noqa: S310 - loopback
            return
        except OSError:
            time.sleep(0.2)
    raise StackError(f"moto's server did not answer on {endpoint} within 30 s; see {log}")


def up(port: int | None, worker_token: str | None) -> None:
    if STATE_FILE.exists():
        raise StackError(f"a local stack is already up ({STATE_FILE}); run `down` first")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = STATE_DIR / "moto.log"
    moto = Path(sys.executable).parent / "moto_server"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - our own venv's moto_server
            [str(moto), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    STATE_FILE.write_text(json.dumps({"pid": process.pid, "endpoint": endpoint}))
    try:
        _wait_ready(endpoint, process, log)
        created = create_resources(endpoint, prefix="ironflow-local")
        environment = dict(created["environment"])
        if worker_token:
            secrets = boto3.client("secretsmanager", endpoint_url=endpoint, region_name=REGION, **CREDENTIALS)
            arn = secrets.create_secret(Name="ironflow-local/worker-token", SecretString=worker_token)["ARN"]
            environment["IRONFLOW_WORKER_TOKEN_SECRET_ARN"] = arn
    except BaseException:
        _stop(process.pid)
        STATE_FILE.unlink(missing_ok=True)
        raise
    exports = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        **environment,
    }
    for name, value in exports.items():
        print(f"export {name}='{value}'")
    print(f"# moto's server: pid {process.pid}, log {log}; stop it with: {sys.argv[0]} down", file=sys.stderr)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def down() -> None:
    if not STATE_FILE.exists():
        print("no local stack is up", file=sys.stderr)
        return
    state = json.loads(STATE_FILE.read_text())
    _stop(int(state["pid"]))
    STATE_FILE.unlink()
    print(f"stopped moto's server (pid {state['pid']}, {state['endpoint']})", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start moto's server and create the resources")
    p_up.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    p_up.add_argument("--worker-token", help="also create a secret holding this worker token")
    sub.add_parser("down", help="stop the server that `up` started")
    p_create = sub.add_parser("create", help="create the resources in a running moto server")
    p_create.add_argument("--endpoint", required=True, help="moto's URL, e.g. http://127.0.0.1:5000")
    p_create.add_argument("--prefix", help="name prefix (default: a fresh unique one)")
    args = parser.parse_args()
    try:
        if args.command == "up":
            up(args.port, args.worker_token)
        elif args.command == "down":
            down()
        else:
            prefix = args.prefix or f"ironflow-{uuid.uuid4().hex[:8]}"
            print(json.dumps(create_resources(args.endpoint, prefix), indent=2))
    except StackError as err:
        print(f"local_stack: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
