//! The machine a run measures on: CPU, memory, kernel, compiler, the commit, the load.

/// What the machine was, read at the start (and its load at the end).
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub memory: String,
    pub kernel: String,
    pub rustc: String,
    /// The commit measured (`git rev-parse --short HEAD`), with "+ uncommitted changes" when
    /// the work tree differs from it; "unknown" outside a git checkout.
    pub commit: String,
    pub load_start: String,
    pub load_end: String,
    pub date: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or_else(|| "unknown".to_string(), |(_, v)| v.trim().to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or_else(
                || "unknown".to_string(),
                |kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0),
            );
        let rustc = std::process::Command::new(
            std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string()),
        )
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let commit = match (
            git(&["rev-parse", "--short", "HEAD"]),
            git(&["status", "--porcelain", "--untracked-files=no"]),
        ) {
            (Some(head), Some(changes)) if !changes.is_empty() => {
                format!("{head} + uncommitted changes")
            }
            (Some(head), _) => head,
            (None, _) => "unknown".to_string(),
        };
        Self {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            commit,
            cpu,
            memory,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".to_string(), |s| s.trim().to_string()),
            rustc,
            load_start: loadavg(),
            load_end: String::new(),
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        }
    }

    pub fn finish(mut self) -> Self {
        self.load_end = loadavg();
        self
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}
