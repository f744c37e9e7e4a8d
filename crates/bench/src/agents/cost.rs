//! Dollars per run (issue 26, item 5): Lambda time only, model tokens apart, on on-demand
//! Lambda, on Lambda Managed Instances and on an always-on reference worker, from named
//! parameters ([`Prices`], each with its source) and figures measured by the run
//! ([`Measured`]). The arithmetic is here, apart from the report, and tested.

/// A price or other input, with where it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    pub value: f64,
    /// Its unit, as the report shows it.
    pub unit: &'static str,
    /// Where it comes from.
    pub source: &'static str,
}

const fn param(value: f64, unit: &'static str, source: &'static str) -> Param {
    Param {
        value,
        unit,
        source,
    }
}

/// The public prices and assumptions the dollars are computed from. The defaults are AWS's
/// list prices in us-east-1 as published in 2025 (no internet here: check before use).
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    /// Lambda duration, arm64, per GB-second.
    pub lambda_gb_s: Param,
    /// Lambda requests (invocations, Function URL requests included), per request.
    pub lambda_request: Param,
    /// The function's memory, MB.
    pub memory_mb: Param,
    /// SQS standard requests, per request.
    pub sqs_request: Param,
    /// SQS requests per wake-up (send, the event source mapping's receive, delete).
    pub sqs_requests_per_wake_up: Param,
    /// Invocations a run causes with push: measured by the pickup rows (creation → claim).
    pub invocations_per_run: Param,
    /// Of them, Function URL requests (the receiver's, short), the rest SQS wake-ups.
    pub function_url_requests_per_run: Param,
    /// Invocations a run that sleeps once causes (the pickup rows' sleep due → claim).
    pub invocations_per_sleeping_run: Param,
    /// The managed instances' instance type's on-demand price per hour.
    pub managed_instance_hour: Param,
    /// Lambda Managed Instances' management fee, a share of the instance price.
    pub managed_fee: Param,
    /// Execution environments (processes) per managed instance.
    pub managed_processes_per_instance: Param,
    /// Instances a capacity provider keeps at least.
    pub managed_min_instances: Param,
    /// The always-on reference worker's instance's on-demand price per hour.
    pub always_on_hour: Param,
}

impl Default for Prices {
    fn default() -> Self {
        const LAMBDA: &str = "AWS Lambda pricing, https://aws.amazon.com/lambda/pricing/, \
                              us-east-1, as published in 2025; check before use";
        const EC2: &str = "Amazon EC2 On-Demand pricing, https://aws.amazon.com/ec2/pricing/\
                           on-demand/, us-east-1, Linux, as published in 2025; check before use";
        const PICKUP: &str = "measured by the pickup rows (BENCHMARKS.md, \"Pickup latency at an \
                              idle fleet\"): invocations per run with push";
        Self {
            lambda_gb_s: param(0.000_013_333_4, "$ per GB-s (arm64)", LAMBDA),
            lambda_request: param(0.20 / 1e6, "$ per request", LAMBDA),
            memory_mb: param(
                1024.0,
                "MB",
                "the template's default FunctionMemorySize (template.yaml)",
            ),
            sqs_request: param(
                0.40 / 1e6,
                "$ per request",
                "Amazon SQS pricing, https://aws.amazon.com/sqs/pricing/, standard queue, \
                 as published in 2025 (past the free tier); check before use",
            ),
            sqs_requests_per_wake_up: param(
                3.0,
                "requests",
                "assumption: SendMessage, the event source mapping's ReceiveMessage and \
                 DeleteMessage (empty receives of its long polls not counted)",
            ),
            invocations_per_run: param(3.0, "invocations", PICKUP),
            function_url_requests_per_run: param(2.0, "requests", PICKUP),
            invocations_per_sleeping_run: param(9.75, "invocations", PICKUP),
            managed_instance_hour: param(0.0816, "$ per hour (m7g.large: 2 vCPU, 8 GiB)", EC2),
            managed_fee: param(
                0.15,
                "share of the instance price",
                "Lambda Managed Instances pricing (compute management fee on the EC2 \
                 on-demand price), https://aws.amazon.com/lambda/pricing/, as published \
                 in 2025; check before use",
            ),
            managed_processes_per_instance: param(
                2.0,
                "processes",
                "assumption: the template's default execution environment (2048 MB, \
                 2 GiB per vCPU: 1 vCPU) twice on a 2-vCPU instance",
            ),
            managed_min_instances: param(
                3.0,
                "instances",
                "assumption: one instance in each of three Availability Zones, as a \
                 capacity provider spreads them; check the capacity provider's minimum",
            ),
            always_on_hour: param(0.0168, "$ per hour (t4g.small: 2 vCPU, 2 GiB)", EC2),
        }
    }
}

/// What the run measured for one workload, in real (unscaled) time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Billed ms of our invocations per run, at a backlog (runs share invocations).
    pub billed_ms_per_run: f64,
    /// Billed ms of an invocation of the receiver or of a wake-up that finds nothing: the
    /// idle invocation measured.
    pub short_invocation_ms: f64,
    /// Runs per second one managed-instances process served.
    pub managed_runs_per_s: f64,
    /// Runs per second the reference worker drained on one instance (at its C).
    pub reference_runs_per_s: f64,
}

/// $ per run on on-demand Lambda: the run's billed time, and every invocation it causes
/// (`invocations` of them, `function_url` the receiver's short ones, the rest but one
/// SQS wake-ups whose short looks bill the short invocation; the one that runs it bills
/// `billed_ms_per_run`).
pub fn on_demand_per_run(p: &Prices, m: &Measured, invocations: f64) -> f64 {
    let gb = p.memory_mb.value / 1024.0;
    let short = (invocations - 1.0).max(0.0);
    let wake_ups = (invocations - p.function_url_requests_per_run.value).max(0.0);
    let ms = m.billed_ms_per_run + short * m.short_invocation_ms;
    ms / 1000.0 * gb * p.lambda_gb_s.value
        + invocations * p.lambda_request.value
        + wake_ups * p.sqs_requests_per_wake_up.value * p.sqs_request.value
}

/// $ per hour of one managed instance, its management fee included.
pub fn managed_instance_hour(p: &Prices) -> f64 {
    p.managed_instance_hour.value * (1.0 + p.managed_fee.value)
}

/// $ per run on managed instances used at their measured capacity (instance-hours at the
/// measured runs per process), the requests included.
pub fn managed_per_run_at_capacity(p: &Prices, m: &Measured) -> f64 {
    let per_instance_s = m.managed_runs_per_s * p.managed_processes_per_instance.value;
    managed_instance_hour(p) / 3600.0 / per_instance_s.max(1e-12)
        + p.invocations_per_run.value * p.lambda_request.value
}

/// $ per run on always-on reference instances used at their measured capacity.
pub fn always_on_per_run_at_capacity(p: &Prices, m: &Measured) -> f64 {
    p.always_on_hour.value / 3600.0 / m.reference_runs_per_s.max(1e-12)
}

/// $ per hour of each option at `rate` runs per second: (on-demand, managed, always-on).
/// Managed and always-on run as many instances as the rate needs at the measured capacity
/// (managed at least its minimum, always-on at least one).
pub fn hourly_at(p: &Prices, m: &Measured, rate: f64) -> (f64, f64, f64) {
    let runs_per_hour = rate * 3600.0;
    let on_demand = runs_per_hour * on_demand_per_run(p, m, p.invocations_per_run.value);
    let per_instance = m.managed_runs_per_s * p.managed_processes_per_instance.value;
    let managed_instances = (rate / per_instance.max(1e-12))
        .ceil()
        .max(p.managed_min_instances.value);
    let managed = managed_instances * managed_instance_hour(p)
        + runs_per_hour * p.invocations_per_run.value * p.lambda_request.value;
    let always_on =
        (rate / m.reference_runs_per_s.max(1e-12)).ceil().max(1.0) * p.always_on_hour.value;
    (on_demand, managed, always_on)
}

/// The lowest arrival rate (runs per second, from 1e-6 up to 1e4 in steps of 1 %) at
/// which `a` becomes cheaper than `b`, staying so up to the next step; `None` if never.
pub fn cheaper_from(
    p: &Prices,
    m: &Measured,
    a: fn((f64, f64, f64)) -> f64,
    b: fn((f64, f64, f64)) -> f64,
) -> Option<f64> {
    let mut rate = 1e-6;
    let mut was_cheaper = {
        let h = hourly_at(p, m, rate);
        a(h) < b(h)
    };
    if was_cheaper {
        return Some(rate);
    }
    while rate < 1e4 {
        rate *= 1.01;
        let h = hourly_at(p, m, rate);
        let cheaper = a(h) < b(h);
        if cheaper && !was_cheaper {
            return Some(rate);
        }
        was_cheaper = cheaper;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> Measured {
        Measured {
            billed_ms_per_run: 100.0,
            short_invocation_ms: 10.0,
            managed_runs_per_s: 10.0,
            reference_runs_per_s: 5.0,
        }
    }

    #[test]
    fn an_on_demand_run_bills_its_time_its_short_invocations_and_every_request() {
        let p = Prices::default();
        let m = measured();
        // 3 invocations: 100 ms + 2 × 10 ms at 1 GB; 3 requests; 1 wake-up of 3 SQS requests.
        let expected = 0.120 * 0.000_013_333_4 + 3.0 * 0.20 / 1e6 + 3.0 * 0.40 / 1e6;
        let got = on_demand_per_run(&p, &m, 3.0);
        assert!((got - expected).abs() < 1e-15, "{got} vs {expected}");
        // A million such runs: 1.60 $ of time, 0.60 $ of Lambda and 1.20 $ of SQS requests.
        assert!((got * 1e6 - 3.40).abs() < 0.001, "{}", got * 1e6);
    }

    #[test]
    fn instances_bill_their_hours_at_the_measured_capacity() {
        let p = Prices::default();
        let m = measured();
        // 2 processes × 10 runs/s per instance: 72 000 runs an hour for 0.0816 × 1.15 $.
        let managed = managed_per_run_at_capacity(&p, &m);
        let expected = 0.0816 * 1.15 / 72_000.0 + 3.0 * 0.20 / 1e6;
        assert!((managed - expected).abs() < 1e-15);
        let always_on = always_on_per_run_at_capacity(&p, &m);
        assert!((always_on - 0.0168 / 18_000.0).abs() < 1e-15);
    }

    #[test]
    fn on_demand_is_cheapest_at_low_rates_and_an_always_on_instance_past_its_crossover() {
        let p = Prices::default();
        let m = measured();
        let (on_demand, always_on) = (|h: (f64, f64, f64)| h.0, |h: (f64, f64, f64)| h.2);
        let from = cheaper_from(&p, &m, always_on, on_demand).expect("a crossover");
        // The always-on instance's hour divided by an on-demand run's dollars.
        let exact = p.always_on_hour.value / 3600.0 / on_demand_per_run(&p, &m, 3.0);
        assert!((from / exact - 1.0).abs() < 0.02, "{from} vs {exact}");
        let h = hourly_at(&p, &m, from / 2.0);
        assert!(h.0 < h.2, "on-demand is cheaper below the crossover");
        // Managed instances, three at least, never beat one small always-on instance here.
        let managed = |h: (f64, f64, f64)| h.1;
        assert!(cheaper_from(&p, &m, managed, always_on).is_none());
    }
}
