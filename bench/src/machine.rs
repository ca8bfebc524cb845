//! Facts about the machine and the software under test, for the head of the results file.

use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `lscpu`'s "Model name", falling back to /proc/cpuinfo.
fn cpu_model() -> String {
    let from_lscpu = output("lscpu", &[]).and_then(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("Model name:").map(|v| v.trim().to_string()))
    });
    from_lscpu
        .or_else(|| {
            std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|text| {
                    text.lines()
                        .find(|l| l.starts_with("model name"))
                        .and_then(|l| l.split_once(':'))
                        .map(|(_, v)| v.trim().to_string())
                })
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// "7.0.15" from `redis-server --version`.
fn redis_version() -> String {
    let path = ferrolock_testbed::redis_server_path();
    output(&path.display().to_string(), &["--version"])
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".to_string())
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

pub fn facts() -> Vec<(String, String)> {
    let date =
        output("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"]).unwrap_or_else(|| "unknown".to_string());
    let nproc = output("nproc", &[]).unwrap_or_else(|| "unknown".to_string());
    let kernel = output("uname", &["-sr"]).unwrap_or_else(|| "unknown".to_string());
    let profile = if cfg!(debug_assertions) {
        "debug (numbers are meaningless: use --release)"
    } else {
        "release"
    };
    vec![
        ("date".into(), date),
        ("cpu".into(), format!("{} × {nproc} (nproc)", cpu_model())),
        ("kernel".into(), kernel),
        ("redis-server".into(), redis_version()),
        (
            "ferrolock".into(),
            format!("{} ({profile} build)", env!("CARGO_PKG_VERSION")),
        ),
        ("load average at start".into(), load_average()),
    ]
}

/// CPU time of the whole machine, from /proc/stat, in clock ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTimes {
    /// user + nice + system + irq + softirq.
    pub busy: u64,
    /// Time the hypervisor ran something else while we wanted the CPU.
    pub steal: u64,
    /// Everything, idle included.
    pub total: u64,
}

impl CpuTimes {
    pub fn now() -> CpuTimes {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
            return CpuTimes::default();
        };
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        CpuTimes {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            total: (0..8).map(at).sum(),
        }
    }
}

/// utime + stime of a process (all its threads), in clock ticks; 0 when it is gone.
pub fn process_ticks(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name, which may contain spaces and ends at the last ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let get = |field: usize| {
        f.get(field - 3)
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

/// How much of the machine other processes (and the hypervisor) took while the bench ran:
/// the measure of how much to trust this run's numbers.
pub fn interference(start: CpuTimes, end: CpuTimes, own_ticks: u64) -> String {
    let total = end.total.saturating_sub(start.total).max(1) as f64;
    let others = end
        .busy
        .saturating_sub(start.busy)
        .saturating_sub(own_ticks) as f64;
    let steal = end.steal.saturating_sub(start.steal) as f64;
    format!(
        "{:.0} % of the machine's CPU time went to other processes, {:.0} % was stolen by the hypervisor{}",
        100.0 * others / total,
        100.0 * steal / total,
        if others / total > 0.10 || steal / total > 0.05 {
            " — the machine was busy: expect noisy ratios, rerun when it is idle"
        } else {
            ""
        }
    )
}
