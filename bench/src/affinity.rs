//! CPU placement. On a 2-vCPU machine a loopback round trip between a client and a server on
//! different CPUs costs several times one between two processes sharing a CPU (wake-up IPIs,
//! cache lines moving), so every scenario is measured twice: pinned (client thread and every
//! server thread on one CPU) and unpinned (the scheduler decides).

use std::io;

/// Where the client and the servers run during one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Client thread and all server threads on this one CPU (what `taskset -c <cpu>` does).
    Pinned(usize),
    /// The client thread on the first CPU, every server thread on the second: a
    /// deterministic cross-CPU round trip (what `Unpinned` gives only when the scheduler
    /// happens to spread them).
    Split(usize, usize),
    /// The CPU mask the bench started with, for everyone.
    Unpinned,
}

impl Placement {
    pub fn label(self) -> String {
        match self {
            Placement::Pinned(cpu) => format!("pinned (cpu {cpu})"),
            Placement::Split(c, s) => format!("split (client cpu {c}, servers cpu {s})"),
            Placement::Unpinned => "unpinned".to_string(),
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Placement::Pinned(_) => "pinned",
            Placement::Split(..) => "split",
            Placement::Unpinned => "unpinned",
        }
    }
}

/// A set of CPUs.
#[derive(Clone)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The CPUs in the set, lowest first.
    pub fn cpus(&self) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| self.contains(c))
            .collect()
    }

    pub fn single(cpu: usize) -> CpuSet {
        // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: CPU_SET only writes bit `cpu` (checked against the set's size by the macro).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        CpuSet(set)
    }

    /// The mask of thread/process `tid` (0 = the calling thread).
    pub fn of(tid: libc::pid_t) -> io::Result<CpuSet> {
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer and size describe `set`, which outlives the call.
        let rc = unsafe {
            libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CpuSet(set))
    }

    pub fn count(&self) -> usize {
        // SAFETY: reads the bit array only.
        unsafe { libc::CPU_COUNT(&self.0) as usize }
    }

    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: reads the bit array only.
        unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// Applies the mask to one thread (0 = the calling thread). Threads it creates later
    /// inherit it.
    pub fn apply(&self, tid: libc::pid_t) -> io::Result<()> {
        // SAFETY: the pointer and size describe `self.0`, which outlives the call.
        let rc = unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &self.0)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Applies the mask to every thread of process `pid` (redis-server has background I/O
    /// threads besides its main one): `taskset -a -p`.
    pub fn apply_to_process(&self, pid: u32) -> io::Result<()> {
        let mut any = false;
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let tid: libc::pid_t = match entry?.file_name().to_string_lossy().parse() {
                Ok(t) => t,
                Err(_) => continue,
            };
            match self.apply(tid) {
                Ok(()) => any = true,
                // A thread that exited between the listing and the call.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
        if !any {
            return Err(io::Error::other(format!(
                "process {pid} has no threads left"
            )));
        }
        Ok(())
    }
}

/// The mask the process started with, taken once before anything is pinned.
pub fn initial() -> &'static CpuSet {
    static INITIAL: std::sync::OnceLock<CpuSet> = std::sync::OnceLock::new();
    INITIAL.get_or_init(|| CpuSet::of(0).expect("sched_getaffinity of the bench's own thread"))
}

impl Placement {
    /// The masks of the client thread and of the servers.
    fn masks(self) -> (CpuSet, CpuSet) {
        match self {
            Placement::Pinned(cpu) => (CpuSet::single(cpu), CpuSet::single(cpu)),
            Placement::Split(client, servers) => (CpuSet::single(client), CpuSet::single(servers)),
            Placement::Unpinned => (initial().clone(), initial().clone()),
        }
    }

    /// Moves the calling thread (the bench's only runtime thread) and every thread of every
    /// server process to this placement.
    pub fn apply(self, server_pids: &[u32]) -> io::Result<()> {
        let (client, servers) = self.masks();
        client.apply(0)?;
        for &pid in server_pids {
            servers.apply_to_process(pid)?;
        }
        Ok(())
    }
}
