//! Real `redis-server` processes and a fault-injecting TCP proxy for ferrolock's integration tests.
//!
//! Everything here is synchronous (std threads and processes) so that any test can use it, whether
//! it runs inside a tokio runtime or not. Every call that changes a server's state (start, kill,
//! pause, resume, restart) checks that the change really happened before it returns, so a test
//! never asserts against a fault that did not take place.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tempfile::TempDir;

mod redis_cluster;
pub use redis_cluster::{ClusterOptions, RedisCluster, Reshard, key_slot, role};

/// Generous on purpose: a loaded 2-core CI machine can take seconds to fork and load a server.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const PORT_ATTEMPTS: usize = 20;
/// The user `client()` and the readiness checks log in as; see `start_with`.
const ADMIN_USER: &str = "ferrolock-testbed";
const ADMIN_PASSWORD: &str = "testbed-admin-secret";

/// Path of the `redis-server` binary on `PATH`.
pub fn redis_server_path() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server is not on PATH; the integration tests need a real one: run `make test` \
                 (it installs it) or `apt-get update && apt-get install -y redis-server`"
            )
        })
}

/// A free loopback port. It is released before use, so another process can still take it: callers
/// retry with a new port when the server fails to bind.
fn free_port() -> u16 {
    // Ports already handed out in this process are never reused, so parallel tests of one binary
    // cannot collide through the kernel handing the same released port to two of them.
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if lock(&HANDED_OUT).insert(port) {
            return port;
        }
    }
}

/// A free port whose cluster bus port (port + 10000) is free too (and exists).
fn free_port_with_bus() -> u16 {
    loop {
        let port = free_port();
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A poisoned lock only means another test panicked; the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns from one thread that lives as long as the test process. PR_SET_PDEATHSIG fires when the
/// *thread* that forked exits, so forking from the test's own thread would kill a server that
/// outlives it (e.g. one kept in a static); forking here kills servers only with the process,
/// which is what keeps a SIGKILLed test run from leaving servers behind on their ports.
fn spawn(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("testbed-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start spawner thread");
        tx
    });
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((cmd, reply_tx))
        .expect("spawner thread is gone");
    reply_rx.recv().expect("spawner thread is gone")
}

/// The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...), `None` when the pid is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; the state follows the last ')'.
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !done() {
        let timed_out = Instant::now() > deadline;
        assert!(
            !timed_out,
            "timed out after {READY_TIMEOUT:?} waiting until {what}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Throwaway CA and server certificate (SAN 127.0.0.1 and localhost), made with the openssl CLI.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Shared so that the files outlive every server and options value that uses them.
    pub dir: Arc<TempDir>,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> TlsFiles {
        let dir = tempfile::Builder::new()
            .prefix("ferrolock-tls-")
            .tempdir()
            .expect("tempdir");
        // Arguments split on whitespace: none of them contains a space.
        let openssl = |args: &str| {
            let out = Command::new("openssl")
                .args(args.split_whitespace())
                .current_dir(dir.path())
                .output()
                .expect("run openssl (apt-get install openssl)");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "openssl {args} failed: {err}");
        };
        // EC keys: RSA generation costs a noticeable share of a 2-core machine per TLS test.
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        openssl(&format!(
            "req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=ferrolock-CA"
        ));
        openssl(&format!(
            "req -new {ec} -keyout server.key -out server.csr -subj /CN=localhost"
        ));
        // webpki rejects a leaf marked CA:TRUE and needs the SAN, so the extensions are explicit.
        fs::write(
            dir.path().join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write server.ext");
        openssl(
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -set_serial 2 -days 2 \
             -extfile server.ext -out server.crt",
        );
        let path = |name: &str| dir.path().join(name);
        TlsFiles {
            ca_cert: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            dir: Arc::new(dir),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    pub tls: Option<TlsFiles>,
    /// ACL file lines, e.g. `user locker on >pw ~lock:* &* +@all`.
    pub acl_users: Vec<String>,
    /// Appended last, so they override the test bed's own settings.
    pub extra_args: Vec<String>,
    /// Keeps redis' default save points (and leaves `appendonly` alone), for persistence tests.
    pub persistence: bool,
}

/// A `redis-server` child process with its own temp dir, killed (with its dir removed) on drop.
pub struct RedisServer {
    opts: ServerOptions,
    dir: TempDir,
    /// The TLS port when TLS is on, else the plain port.
    port: u16,
    /// Always plain TCP, so that assertions need no TLS.
    plain_port: u16,
    child: Option<Child>,
    pid: u32,
}

enum LaunchError {
    PortTaken,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(ServerOptions::default())
    }

    pub fn start_with(opts: ServerOptions) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("ferrolock-redis-")
            .tempdir()
            .expect("tempdir");
        // Always an ACL file with our own user, so assertions keep working whatever a test does
        // to `default` (turns it off, sets requirepass, ACL SETUSER at run time).
        let mut acl = opts.acl_users.join("\n");
        acl.push_str(&format!(
            "\nuser {ADMIN_USER} on >{ADMIN_PASSWORD} ~* &* +@all\n"
        ));
        fs::write(dir.path().join("users.acl"), acl).expect("write users.acl");
        let mut server = RedisServer {
            opts,
            dir,
            port: 0,
            plain_port: 0,
            child: None,
            pid: 0,
        };
        let cluster_bus = server
            .opts
            .extra_args
            .iter()
            .any(|a| a == "--cluster-enabled");
        for _ in 0..PORT_ATTEMPTS {
            server.port = if cluster_bus {
                free_port_with_bus()
            } else {
                free_port()
            };
            server.plain_port = if server.opts.tls.is_some() {
                free_port()
            } else {
                server.port
            };
            match server.launch() {
                Ok(()) => return server,
                Err(LaunchError::PortTaken) => continue,
            }
        }
        panic!(
            "redis-server failed to bind a free port {PORT_ATTEMPTS} times; log:\n{}",
            server.log()
        );
    }

    fn args(&self) -> Vec<String> {
        let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let path = |p: &Path| p.display().to_string();
        let mut args = words(&format!(
            "--port {} --bind 127.0.0.1 --daemonize no --protected-mode no",
            self.plain_port
        ));
        // redis 7 has no `--user`, and `user` lines in a config cannot be combined with an aclfile.
        args.extend(
            [
                "--dir",
                &path(self.dir()),
                "--aclfile",
                &path(&self.dir().join("users.acl")),
            ]
            .map(String::from),
        );
        if !self.opts.persistence {
            // Without this a server writes dump.rdb and reloads it on restart, resurrecting locks.
            args.extend(["--save", "", "--appendonly", "no"].map(String::from));
        }
        if let Some(tls) = &self.opts.tls {
            // `--tls-auth-clients no`, or the server demands a client certificate.
            args.extend(words(&format!(
                "--tls-port {} --tls-auth-clients no",
                self.port
            )));
            args.extend(["--tls-cert-file", &path(&tls.server_cert)].map(String::from));
            args.extend(["--tls-key-file", &path(&tls.server_key)].map(String::from));
            args.extend(["--tls-ca-cert-file", &path(&tls.ca_cert)].map(String::from));
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the process on the current ports and waits until it (and not some other server that
    /// took the port meanwhile) answers PING.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open redis.log");
        writeln!(
            log,
            "--- testbed: starting on port {} (plain {}) ---",
            self.port, self.plain_port
        )
        .expect("write log");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(redis_server_path());
        cmd.args(self.args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        let child = spawn(cmd).unwrap_or_else(|e| panic!("spawn redis-server: {e}"));
        self.pid = child.id();
        // Stored before waiting, so that a panic below still kills it in Drop.
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("try_wait"));
            if let Some(status) = exited {
                self.child = None;
                let log = self.log_since(log_start);
                if log.contains("Address already in use") {
                    return Err(LaunchError::PortTaken);
                }
                panic!("redis-server exited with {status} while starting; log:\n{log}");
            }
            if self.answers_ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                panic!(
                    "redis-server did not answer PING within {READY_TIMEOUT:?}; log:\n{}",
                    self.log_since(log_start)
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut con) = self.try_client(Duration::from_millis(500)) else {
            return false;
        };
        let own = redis::cmd("INFO")
            .arg("server")
            .query::<String>(&mut con)
            .is_ok_and(|info| {
                info.lines()
                    .any(|l| l.trim() == format!("process_id:{}", self.pid))
            });
        // PING, not just INFO: a server still loading its dump answers INFO but refuses PING.
        own && redis::cmd("PING")
            .query::<String>(&mut con)
            .is_ok_and(|p| p == "PONG")
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = Vec::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            let _ = f
                .seek(SeekFrom::Start(offset))
                .and_then(|_| f.read_to_end(&mut text));
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Everything the server (and its earlier incarnations before a restart) wrote to stdout/stderr.
    pub fn log(&self) -> String {
        self.log_since(0)
    }

    /// The server's own temp dir (`--dir`): its log, ACL file and any dump.rdb live here.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The pid of the current (or, after `kill`, the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// SIGKILL, then reaps it and checks that the pid is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("wait for redis-server");
            assert!(
                proc_state(self.pid).is_none(),
                "redis-server pid {} still exists after SIGKILL",
                self.pid
            );
        }
    }

    /// SIGSTOP; returns once the kernel reports the process stopped, so the fault is in place.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP, "SIGSTOP");
        wait_until("redis-server is stopped", || {
            proc_state(self.pid) == Some('T')
        });
    }

    /// SIGCONT; returns once the server answers PING again.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT, "SIGCONT");
        wait_until("redis-server answers PING after SIGCONT", || {
            self.answers_ping()
        });
    }

    fn signal(&self, sig: libc::c_int, name: &str) {
        assert!(
            self.is_running(),
            "{name}: redis-server port {} is not running",
            self.port
        );
        // SAFETY: plain syscall; the pid is our child and not reaped yet, so it is not reused.
        let sent = unsafe { libc::kill(self.pid as libc::pid_t, sig) } == 0;
        assert!(
            sent,
            "{name} pid {}: {}",
            self.pid,
            io::Error::last_os_error()
        );
    }

    /// Kills the server if it runs, then starts it again on the same port(s), dir and options.
    pub fn restart(&mut self) {
        self.kill();
        if !self.opts.persistence {
            // `--save ""` stops automatic saves, yet redis still loads a dump.rdb it finds (one
            // written by an explicit SAVE, say), which would bring a lock back to life.
            let _ = fs::remove_file(self.dir.path().join("dump.rdb"));
            let _ = fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        }
        // The port may be briefly held by someone else (a client's ephemeral port, a test): wait
        // for it rather than move, since the whole point is that clients reconnect to the same port.
        let deadline = Instant::now() + READY_TIMEOUT;
        while let Err(LaunchError::PortTaken) = self.launch() {
            assert!(
                Instant::now() < deadline,
                "restart: port {} stayed taken; log:\n{}",
                self.port,
                self.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// True while stopped by `pause` (SIGSTOP): it cannot answer.
    pub fn is_paused(&self) -> bool {
        self.is_running() && proc_state(self.pid) == Some('T')
    }

    /// True while the process exists, including while paused.
    pub fn is_running(&self) -> bool {
        self.child.is_some() && matches!(proc_state(self.pid), Some(s) if s != 'Z' && s != 'X')
    }

    fn try_client(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let (user, port) = (format!("{ADMIN_USER}:{ADMIN_PASSWORD}"), self.plain_port);
        let client = redis::Client::open(format!("redis://{user}@127.0.0.1:{port}"))?;
        let con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        Ok(con)
    }

    /// A plain connection for assertions (on the extra plain port for TLS servers, as the test
    /// bed's own all-powerful user). Reads time out after 10 s so a paused server fails a
    /// test instead of hanging it.
    pub fn client(&self) -> redis::Connection {
        self.try_client(READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to redis-server on port {}: {e}", self.plain_port))
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let (name, rest) = args
            .split_first()
            .expect("cmd needs at least a command name");
        let mut cmd = redis::cmd(name);
        for arg in rest {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.client())
            .unwrap_or_else(|e| panic!("{args:?} on redis-server port {}: {e}", self.plain_port))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL too, but SIGCONT first lets it go at once.
            // SAFETY: plain syscall on our own, not yet reaped child.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGCONT) };
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("--- redis-server port {} log tail ---", self.port);
            tail.iter().rev().for_each(|l| eprintln!("{l}"));
        }
    }
}

/// Independent servers, as for a Redlock quorum.
pub struct Cluster {
    pub servers: Vec<RedisServer>,
}

impl Cluster {
    pub fn start(n: usize) -> Cluster {
        Cluster {
            servers: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The form the CLI and bindings take their node list in.
    pub fn nodes_env(&self) -> String {
        self.urls().join(",")
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Forward,
    Blackhole,
    Cut,
}

/// One direction of a proxied link.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Direction {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Up => 0,
            Direction::Down => 1,
        }
    }
}

struct ProxyState {
    mode: Mode,
    /// Per direction, indexed by `Direction::index`.
    delay: [Duration; 2],
    /// Per direction: bytes are read and kept in order, and delivered only once released, so a
    /// request is applied on the server while its reply arrives as late as the test wants.
    held: [bool; 2],
    /// Clones of both sockets of every live link, so that `cut` can shut them down.
    links: HashMap<u64, [TcpStream; 2]>,
    /// Per direction: chunks read so far (on every link), forwarded or held.
    chunks: [u64; 2],
}

struct ProxyShared {
    target_port: u16,
    state: Mutex<ProxyState>,
    next_id: AtomicU64,
    stop: AtomicBool,
}

impl ProxyShared {
    fn close(&self, id: u64) {
        if let Some(link) = lock(&self.state).links.remove(&id) {
            link.iter().for_each(|s| drop(s.shutdown(Shutdown::Both)));
        }
    }
}

/// A TCP proxy on 127.0.0.1 in front of a local port, for network faults. A connection made
/// while the target is down is accepted and closed at once, as a proxy in front of a dead host.
pub struct Proxy {
    port: u16,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("local_addr").port();
        let shared = Arc::new(ProxyShared {
            target_port,
            state: Mutex::new(ProxyState {
                mode: Mode::Forward,
                delay: [Duration::ZERO; 2],
                held: [false; 2],
                links: HashMap::new(),
                chunks: [0; 2],
            }),
            next_id: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{port}"))
                .spawn(move || accept_loop(listener, shared))
                .expect("start proxy thread")
        };
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Latency added to every chunk read from now on, in each direction (so twice per round trip).
    pub fn set_delay(&self, d: Duration) {
        lock(&self.shared.state).delay = [d; 2];
    }

    /// Latency added to every chunk read from now on in one direction only.
    pub fn set_delay_dir(&self, dir: Direction, d: Duration) {
        lock(&self.shared.state).delay[dir.index()] = d;
    }

    /// Keeps every byte going in `dir` (on all links, new ones included) until `release`: the
    /// bytes are read and queued in order, so a held request or reply is delivered later, intact.
    pub fn hold(&self, dir: Direction) {
        lock(&self.shared.state).held[dir.index()] = true;
    }

    /// Delivers what `hold` kept, in order, and forwards normally from then on.
    pub fn release(&self, dir: Direction) {
        lock(&self.shared.state).held[dir.index()] = false;
    }

    /// Links stay open and new ones are accepted, but every byte is dropped: a silent network.
    pub fn blackhole(&self) {
        lock(&self.shared.state).mode = Mode::Blackhole;
    }

    /// Closes every link and closes new ones as soon as they are accepted.
    pub fn cut(&self) {
        let mut state = lock(&self.shared.state);
        state.mode = Mode::Cut;
        for link in state.links.drain().map(|(_, link)| link) {
            link.iter().for_each(|s| drop(s.shutdown(Shutdown::Both)));
        }
    }

    /// A network reset: closes every live link, dropping what `hold` kept for them, and
    /// forwards normally (no hold, no delay) on the links made from then on. A request held
    /// in `Down` has run on the server; its client never gets the reply.
    pub fn reset(&self) {
        let mut state = lock(&self.shared.state);
        state.mode = Mode::Forward;
        state.delay = [Duration::ZERO; 2];
        state.held = [false; 2];
        for link in state.links.drain().map(|(_, link)| link) {
            link.iter().for_each(|s| drop(s.shutdown(Shutdown::Both)));
        }
    }

    /// Chunks read in `dir` so far, on every link (forwarded or held): a request that reached
    /// the proxy while `Up` is held shows here.
    pub fn chunks_read(&self, dir: Direction) -> u64 {
        lock(&self.shared.state).chunks[dir.index()]
    }

    /// Plain forwarding again, without delay; held bytes are delivered. Links cut earlier stay
    /// closed.
    pub fn heal(&self) {
        let mut state = lock(&self.shared.state);
        state.mode = Mode::Forward;
        state.delay = [Duration::ZERO; 2];
        state.held = [false; 2];
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the blocking accept so the thread sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(upstream) = TcpStream::connect(("127.0.0.1", shared.target_port)) else {
            continue;
        };
        let streams = [&client, &client, &upstream, &upstream].map(|s| s.try_clone());
        let [Ok(c_read), Ok(c_write), Ok(u_read), Ok(u_write)] = streams else {
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        {
            // Checked under the lock that `cut` holds, so no link slips past a cut.
            let mut state = lock(&shared.state);
            if state.mode == Mode::Cut {
                continue;
            }
            state.links.insert(id, [client, upstream]);
        }
        // Small redis commands would otherwise sit in Nagle's buffer, adding latency of our own.
        let _ = c_read.set_nodelay(true);
        let _ = u_read.set_nodelay(true);
        pump(Arc::clone(&shared), id, Direction::Up, c_read, u_write);
        pump(Arc::clone(&shared), id, Direction::Down, u_read, c_write);
    }
}

/// One direction of a link: a reader stamps each chunk with its due time and a writer releases it
/// then, so a delay adds latency without throttling throughput or reordering bytes.
fn pump(shared: Arc<ProxyShared>, id: u64, dir: Direction, mut from: TcpStream, mut to: TcpStream) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_shared = Arc::clone(&shared);
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let (mode, delay) = {
                let mut state = lock(&reader_shared.state);
                state.chunks[dir.index()] += 1;
                (state.mode, state.delay[dir.index()])
            };
            match mode {
                Mode::Forward if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_ok() => {}
                Mode::Blackhole => {}
                _ => break,
            }
        }
        // Dropping `tx` lets the writer deliver what is still delayed before it closes the link.
    });
    thread::spawn(move || {
        for (due, bytes) in rx {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            // A hold keeps this chunk, and so every later one, until released (or the link is
            // cut or the proxy stopped, which drop them).
            let live = loop {
                let state = lock(&shared.state);
                if shared.stop.load(Ordering::SeqCst) || !state.links.contains_key(&id) {
                    break false;
                }
                if !state.held[dir.index()] {
                    break true;
                }
                drop(state);
                thread::sleep(Duration::from_millis(2));
            };
            if !live || to.write_all(&bytes).is_err() {
                break;
            }
        }
        // Either side ending ends the whole link; redis clients never half-close.
        shared.close(id);
    });
}
