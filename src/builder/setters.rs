//! The builder's setting methods, one per setting (its documentation ends with the line of
//! its row of the settings table: variable, default, bounds), in the README's order: the
//! API, the invocation, the lease, the poison pill, the wake-ups and the rest.

use std::time::Duration;

use super::LambdaWorkerBuilder;
use crate::poison::PoisonMode;
use crate::settings::WebhookSecret;
use crate::wake::Waker;

impl LambdaWorkerBuilder {
    /// Accept a plain `http://` URL (the API's, the heartbeat's) to a host that is not loopback (an
    /// API inside the VPC): the worker token then crosses the network in clear text. Off, such a
    /// URL is refused at build time; `https://` URLs and `http://` to a loopback host need nothing.
    /// Variable `IRONFLOW_ALLOW_INSECURE_HTTP`; default `false`.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.settings.allow_insecure_http = allow;
        self
    }

    /// Runs executing at once in one invocation, C. The execution runtime has M × C + 1 threads (M:
    /// [`concurrent_invocations`](Self::concurrent_invocations)). Variable `IRONFLOW_CONCURRENCY`;
    /// default 2; ≥ 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.settings.concurrency = n;
        self
    }

    /// Invocations one process serves at once, M (Lambda Managed Instances set the variable from
    /// the function's `PerExecutionEnvironmentMaxConcurrency`). At 1, one invocation at a time, as
    /// on-demand Lambda sends them; a second call of [`crate::handle`] waits for the first to
    /// return. Above 1, that many invocations run at once, each with its own C runs, lease,
    /// handbacks, step logs and summary; the execution runtime has M × C + 1 threads; M × C is at
    /// most 4096. Variable `AWS_LAMBDA_MAX_CONCURRENCY`; default 1; ≥ 1.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// // 4 invocations at once, each executing at most 2 runs: at most 8 runs in the process.
    /// let builder = builder.concurrent_invocations(4).concurrency(2);
    /// ```
    pub fn concurrent_invocations(mut self, m: usize) -> Self {
        self.settings.concurrent_invocations = m;
        self
    }

    /// Turn the webhook receiver on with its secret (or the Secrets Manager secret
    /// `IRONFLOW_WEBHOOK_SECRET_ARN` names): the key of the API's `X-Signature-256` HMAC, or the
    /// `token` query parameter of the URL the API posts to (docs/push.md); at least 32 visible
    /// ASCII characters. Off, a Function URL event is answered 503. Needs a wake queue
    /// ([`wake_ups`](Self::wake_ups) or `IRONFLOW_WAKE_QUEUE_URL`). A secret set here is never
    /// re-read: it replaces one read from `IRONFLOW_WEBHOOK_SECRET_ARN` (whose current and
    /// previous versions are accepted, and re-read after a rotation). Variable
    /// `IRONFLOW_WEBHOOK_SECRET`; default none: receiver off.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.webhook_secret("a-long-random-secret-of-32-chars-or-more");
    /// ```
    pub fn webhook_secret(mut self, secret: &str) -> Self {
        self.settings.webhook_secret = Some(WebhookSecret::new(secret));
        self.webhook_source = None;
        self
    }

    /// How far an event's `at` may be from now, either way, for the webhook receiver to take
    /// it, in whole seconds: an event outside it is refused
    /// (401), and an event taken is not taken again within it (docs/push.md, "Replays").
    /// Variable `IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS` (seconds); default 300; 1 s to 3600 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.webhook_replay_window(Duration::from_secs(120));
    /// ```
    pub fn webhook_replay_window(mut self, window: Duration) -> Self {
        self.settings.webhook_replay_window = window;
        self
    }

    /// What the function serves (`IRONFLOW_FUNCTION_ROLE`):
    /// [`FunctionRole::Worker`](crate::settings::FunctionRole::Worker) (the default) runs batches, and
    /// answers Function URL requests too when a webhook secret is set;
    /// [`FunctionRole::WebhookReceiver`](crate::settings::FunctionRole::WebhookReceiver) answers Function
    /// URL requests only and refuses every other event with an error naming the role
    /// (docs/push.md, "Denial of service"). Variable `IRONFLOW_FUNCTION_ROLE`; default `worker`.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.function_role(ironflow_lambda::settings::FunctionRole::WebhookReceiver);
    /// ```
    pub fn function_role(mut self, role: crate::settings::FunctionRole) -> Self {
        self.settings.function_role = role;
        self
    }

    /// Runs one invocation claims at most, N. A larger N makes invocation boundaries rarer, and
    /// lets more runs meet the cutoff and be handed back. Variable
    /// `IRONFLOW_MAX_RUNS_PER_INVOCATION`; default 8; ≥ 1.
    pub fn max_runs_per_invocation(mut self, n: usize) -> Self {
        self.settings.max_runs_per_invocation = n;
        self
    }

    /// A run attempt's limit on executed time, summed across the invocations that ran it: time
    /// it slept or waited for a signal, an approval or a human input does not count (read from
    /// the attempt's steps at each claim; what counts is defined in `docs/design.md`); more than
    /// zero. Variable `IRONFLOW_RUN_TIMEOUT_SECS` (seconds); default 1800.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.run_timeout(Duration::from_secs(2 * 3600));
    /// ```
    pub fn run_timeout(mut self, timeout: Duration) -> Self {
        self.settings.run_timeout = timeout;
        self
    }

    /// Time kept free before the invocation deadline to hand runs back and answer: the cutoff is
    /// `deadline − margin`; below the function timeout. The handback's writes are retried within it
    /// when the API fails, so a larger margin rides out a longer API blip. Variable
    /// `IRONFLOW_DEADLINE_MARGIN_MS` (milliseconds); default 10000; ≥ 500 ms.
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.settings.deadline_margin = margin;
        self
    }

    /// No run is claimed once less than this is left before the cutoff. Variable
    /// `IRONFLOW_MIN_CLAIM_BUDGET_MS` (milliseconds); default 2000; ≥ 100 ms.
    pub fn min_claim_budget(mut self, budget: Duration) -> Self {
        self.settings.min_claim_budget = budget;
        self
    }

    /// Claim one run ahead of a free slot while, on this instance, a claim's round trip is at least
    /// `percent` % of a run's execution time; 0 claims as the reference worker: one claim at a
    /// time, each into a free slot. Variable `IRONFLOW_CLAIM_AHEAD_PERCENT`; default 20.
    pub fn claim_ahead_percent(mut self, percent: u32) -> Self {
        self.settings.claim_ahead_percent = percent;
        self
    }

    /// The function's configured timeout, the template's `Timeout`; more than zero. The margin must
    /// be below it; the loop guard's stall rule counts half of it. Variable
    /// `IRONFLOW_FUNCTION_TIMEOUT_SECS` (seconds); default 900.
    pub fn function_timeout(mut self, timeout: Duration) -> Self {
        self.settings.function_timeout = timeout;
        self
    }

    /// Lease TTL requested on claim and refresh, in whole seconds, the range the API accepts. Once
    /// a lease expires, the API's reaper takes the run back: it requeues it, or fails it once its
    /// lease expired more times than the run's `max_retries`. Variable `IRONFLOW_LEASE_TTL_SECS`
    /// (seconds); default 90; 1 s to 3600 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// // Keep the TTL at least twice the refresh interval: the rest is for retries.
    /// let builder = builder
    ///     .lease_ttl(Duration::from_secs(60))
    ///     .lease_refresh_interval(Duration::from_secs(20));
    /// ```
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl;
        self
    }

    /// Lease refresh interval, more than zero and below the lease TTL (keep the TTL at least twice
    /// the interval: what is left of it is the time failed refreshes are retried in). Variable
    /// `IRONFLOW_LEASE_REFRESH_INTERVAL_SECS` (seconds); default 30.
    pub fn lease_refresh_interval(mut self, interval: Duration) -> Self {
        self.settings.lease_refresh_interval = interval;
        self
    }

    /// Add worker tags sent with each claim (the variable is comma-separated). Each tag is 1 to 64
    /// bytes of ASCII letters, digits and `- _ . : / =`, at most 32 tags; surrounding whitespace
    /// and duplicates are dropped. Variable `IRONFLOW_WORKER_TAGS`; default none.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.tags(["region:eu", "gpu"]);
    /// ```
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Prefix of the worker id. Each invocation claims under its own id, `<prefix>-<request id>-<8
    /// hex>`, so a lease tells which invocation holds it; no leading space (the API trims ids) and
    /// no control character. Variable `IRONFLOW_WORKER_ID_PREFIX`; default `lambda`.
    pub fn worker_id_prefix(mut self, prefix: &str) -> Self {
        self.settings.worker_id_prefix = prefix.to_string();
        self
    }

    /// Consecutive failures that block a workflow as a poison pill. Variable
    /// `IRONFLOW_POISON_THRESHOLD`; default 3; ≥ 1.
    pub fn poison_threshold(mut self, n: u32) -> Self {
        self.settings.poison.threshold = n;
        self
    }

    /// How long a blocked workflow stays blocked after its last failure. Variable
    /// `IRONFLOW_POISON_COOLDOWN_SECS` (seconds); default 300.
    pub fn poison_cooldown(mut self, cooldown: Duration) -> Self {
        self.settings.poison.cooldown = cooldown;
        self
    }

    /// Prefix of every key in the poison-pill table, so several functions can share one table: 1 to
    /// 200 bytes, no `#`. Variable `IRONFLOW_POISON_NAMESPACE`; default `AWS_LAMBDA_FUNCTION_NAME`,
    /// else `ironflow`.
    pub fn poison_namespace(mut self, namespace: &str) -> Self {
        self.settings.poison_namespace = namespace.to_string();
        self
    }

    /// What happens to the runs of a blocked workflow: `Fail` fails a claimed run; `Defer` leaves
    /// blocked workflows out of the claim so their runs stay Pending until the cooldown ends.
    /// Variable `IRONFLOW_POISON_MODE`; default `fail`.
    ///
    /// ```no_run
    /// use ironflow_lambda::poison::PoisonMode;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.poison_mode(PoisonMode::Defer);
    /// ```
    pub fn poison_mode(mut self, mode: PoisonMode) -> Self {
        self.settings.poison_mode = mode;
        self
    }

    /// Dead man's switch URL pinged with `HEAD` once per invocation that completed its batch
    /// (Healthchecks.io, Cronitor, Better Stack...): `https://`, or `http://` as for the API's URL.
    /// Never logged: such URLs usually embed a secret. Variable `IRONFLOW_HEARTBEAT_URL`; default
    /// none.
    pub fn heartbeat_url(mut self, url: &str) -> Self {
        self.settings.heartbeat_url = Some(url.to_string());
        self
    }

    /// Invocation length used when `Context.deadline` has already passed, as under an emulator
    /// (`cargo lambda watch` sends a deadline in 1970); more than zero. Unset, a past deadline
    /// claims nothing. Lambda always sends a future deadline, so this never applies there. Variable
    /// `IRONFLOW_EMULATED_INVOCATION_SECS` (seconds); default none.
    pub fn emulated_invocation(mut self, length: Duration) -> Self {
        self.settings.emulated_invocation = Some(length);
        self
    }

    /// Send wake-ups after a batch that handed runs back or left a backlog, through `waker` (its
    /// queue, a standard SQS queue, and limits). Default: the queue of the settings, if any, over
    /// the AWS configuration ([`LambdaWorkerBuilder::aws_config`]); none without a queue. Variable
    /// `IRONFLOW_WAKE_QUEUE_URL`; default none. Variable `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`;
    /// default 3; 1 to 10. Variable `IRONFLOW_WAKE_DELAY_SECS` (seconds); default 5; 0 s to 900 s.
    pub fn wake_ups(mut self, waker: Waker) -> Self {
        self.waker = Some(waker);
        self
    }

    /// Handbacks in a row without a completed step before a run is failed by the loop guard.
    /// Variable `IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS`; default 3; ≥ 1.
    pub fn max_handbacks_without_progress(mut self, n: u32) -> Self {
        self.settings.max_handbacks_without_progress = n;
        self
    }

    /// Whether a step that would not fit in the time left before the cutoff is not started: the
    /// run is handed back at once, and the next invocation starts the step with a full budget
    /// (docs/design.md, "Cutoff-aware starts"). `false`: every step starts as the engine asks,
    /// and one still running at the cutoff is cut there. Variable
    /// `IRONFLOW_CUTOFF_AWARE_STARTS`; default `true`.
    pub fn cutoff_aware_starts(mut self, on: bool) -> Self {
        self.settings.cutoff_aware_starts = on;
        self
    }

    /// The expected duration of a step this process never saw complete and whose run never
    /// recorded it, for cutoff-aware starts ([`LambdaWorkerBuilder::cutoff_aware_starts`]).
    /// Variable `IRONFLOW_DEFAULT_STEP_SECS` (seconds); default 10.
    pub fn default_step_duration(mut self, expected: Duration) -> Self {
        self.settings.default_step_duration = expected;
        self
    }

    /// How long an agent step that sets no `max_capacity_wait` of its own may wait for provider
    /// capacity in all, across the sleeps it is put to (every provider account rate limited, or
    /// Bedrock throttling past its retries: [`crate::BedrockProvider`]); the run sleeps, holding
    /// no invocation. Variable `IRONFLOW_MAX_CAPACITY_WAIT_SECS` (seconds);
    /// default 21600.
    pub fn max_capacity_wait(mut self, wait: Duration) -> Self {
        self.settings.max_capacity_wait = wait;
        self
    }

    /// How runs put to sleep for provider capacity together are woken spread out: each wake time
    /// moves later by an offset drawn from the run id over a window of half the wait, at least
    /// `spread` and at most `max` (never below `spread`); zero for both: no spread. Wider than
    /// the API waker's 10 s tick and the timer wake-ups' 2 s grouping by default
    /// Variable `IRONFLOW_CAPACITY_SPREAD_SECS` (seconds); default 30.
    /// Variable `IRONFLOW_CAPACITY_SPREAD_MAX_SECS` (seconds); default 300.
    pub fn capacity_spread(mut self, spread: Duration, max: Duration) -> Self {
        self.settings.capacity_spread = spread;
        self.settings.capacity_spread_max = max;
        self
    }

    /// CloudWatch namespace of the EMF metrics: 1 to 255 of ASCII letters, digits, `. - _ / # :`
    /// and space, not starting with `:` or `AWS/` (CloudWatch drops the metrics of any other).
    /// Variable `IRONFLOW_METRICS_NAMESPACE`; default `ironflow-lambda`.
    pub fn metrics_namespace(mut self, namespace: &str) -> Self {
        self.settings.metrics_namespace = namespace.to_string();
        self
    }

    /// Idle gap after which an invocation first probes the HTTP connection pools for
    /// connections dropped during the freeze (no variable). Default 10 s.
    pub fn idle_probe_after(mut self, gap: Duration) -> Self {
        self.idle_probe_after = gap;
        self
    }
}
