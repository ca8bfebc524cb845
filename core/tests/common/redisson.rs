//! The scripted Redisson 4.7.0 client of the interop tests (tests/redisson, a Maven project):
//! `FERROLOCK_REDISSON_CP` is its class path; unset, the first test to need it builds it once
//! with `mvn -q -B package` (Java 17+ and Maven on the PATH) and fails, never skips, when it
//! cannot.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// The Java client's class path: `FERROLOCK_REDISSON_CP`, or tests/redisson built here once.
pub fn redisson_classpath() -> &'static str {
    static CP: OnceLock<String> = OnceLock::new();
    CP.get_or_init(|| {
        if let Ok(cp) = std::env::var("FERROLOCK_REDISSON_CP") {
            return cp;
        }
        let project = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/redisson");
        let started = Instant::now();
        let out = std::process::Command::new("mvn")
            .args(["-q", "-B", "-f"])
            .arg(project.join("pom.xml"))
            .arg("package")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "the Redisson interop tests need the Java client in tests/redisson: running \
                     `mvn` failed ({e}); install Maven and Java 17+, or set FERROLOCK_REDISSON_CP \
                     to its class path"
                )
            });
        assert!(
            out.status.success(),
            "`mvn -q -B -f tests/redisson/pom.xml package` failed (set FERROLOCK_REDISSON_CP to \
             skip the build):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("built tests/redisson in {:?}", started.elapsed());
        let target = project.join("target");
        let deps = std::fs::read_to_string(target.join("classpath.txt"))
            .expect("mvn package writes target/classpath.txt");
        format!("{}:{}", target.join("classes").display(), deps.trim())
    })
}

/// The scripted Redisson client (tests/redisson/src/main/java/ferrolock/interop/Client.java):
/// one command per line on its stdin, one reply line each on its stdout. All its RLock calls
/// run on one Java thread, its one owner.
pub struct Redisson {
    child: Child,
    stdin: ChildStdin,
    pub lines: mpsc::UnboundedReceiver<String>,
    pub stderr: Arc<Mutex<String>>,
    /// Redisson's client id: the first half of its hash field `"<id>:<thread id>"`.
    pub id: String,
}

impl Redisson {
    /// `classpath`: from `redisson_classpath()`, taken before the cluster starts (the build may
    /// take a while).
    /// `url`: the server (`mode` "single") or a cluster's seed node (`mode` "sharded" or
    /// "classic", its pub/sub).
    pub async fn start(classpath: &str, url: &str, mode: &str) -> Redisson {
        let mut child = Command::new("java")
            .arg("-cp")
            .arg(classpath)
            .arg("ferrolock.interop.Client")
            .arg(url)
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run java (Java 17+ on the PATH)");
        let (tx, lines) = mpsc::unbounded_channel();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let stdin = child.stdin.take().unwrap();
        let mut r = Redisson {
            child,
            stdin,
            lines,
            stderr,
            id: String::new(),
        };
        let ready = r.expect("ready ", Duration::from_secs(60)).await;
        r.id = ready["ready ".len()..].to_string();
        r
    }

    pub async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the Java client");
        self.stdin.flush().await.unwrap();
    }

    /// The next line, which must start with `prefix`, within `within`.
    pub async fn expect(&mut self, prefix: &str, within: Duration) -> String {
        let line = tokio::time::timeout(within, self.lines.recv()).await;
        match line {
            Ok(Some(line)) if line.starts_with(prefix) => line,
            other => panic!(
                "the Java client: expected {prefix:?} within {within:?}, got {other:?} \
                 (exited: {:?}); its stderr:\n{}",
                self.child.try_wait(),
                self.stderr.lock().unwrap()
            ),
        }
    }

    /// `RLock.tryLock(0, 120 s)`: true if granted.
    pub async fn try_lock(&mut self, key: &str) -> bool {
        self.send(&format!("try {key}")).await;
        let reply = self
            .expect(&format!("try {key} "), Duration::from_secs(30))
            .await;
        reply.ends_with(" true")
    }

    /// SIGKILLs the Java client (no shutdown hook, no unlock: a crash) and returns once it is
    /// reaped; panics unless it died of that signal, the proof of the fault.
    pub async fn kill(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        self.child.kill().await.expect("SIGKILL the Java client");
        let status = self.child.wait().await.expect("reap the Java client");
        assert_eq!(
            status.signal(),
            Some(9),
            "the Java client's end: {status:?}"
        );
    }

    pub async fn unlock(&mut self, key: &str) {
        self.send(&format!("unlock {key}")).await;
        self.expect(&format!("unlocked {key}"), Duration::from_secs(30))
            .await;
    }
}
