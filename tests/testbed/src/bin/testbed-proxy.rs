//! The test bed's fault proxies, driven over stdin, for harnesses written in other languages
//! (tests/faults drives it from Python). One line per command, one reply line per command:
//!
//! ```text
//! new <target_port>                  -> ok <id> <listen_port>
//! <id> delay up|down|both <ms>       -> ok
//! <id> hold up|down                  -> ok
//! <id> release up|down               -> ok
//! <id> cut | blackhole | heal        -> ok
//! ```
//!
//! Anything else gets `err <why>`. The proxies stop when stdin closes (the harness died).

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::time::Duration;

use ferrolock_testbed::{Direction, Proxy};

fn dirs(word: &str) -> Result<Vec<Direction>, String> {
    match word {
        "up" => Ok(vec![Direction::Up]),
        "down" => Ok(vec![Direction::Down]),
        "both" => Ok(vec![Direction::Up, Direction::Down]),
        other => Err(format!("direction {other:?} is not up, down or both")),
    }
}

fn run(proxies: &mut HashMap<u64, Proxy>, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if let ["new", target] = words[..] {
        let target: u16 = target
            .parse()
            .map_err(|_| format!("target port {target:?} is not a port"))?;
        let id = proxies.len() as u64;
        let proxy = Proxy::start(target);
        let port = proxy.port();
        proxies.insert(id, proxy);
        return Ok(format!("ok {id} {port}"));
    }
    let (id, rest) = words
        .split_first()
        .ok_or_else(|| "empty command".to_string())?;
    let id: u64 = id
        .parse()
        .map_err(|_| format!("proxy id {id:?} is not a number"))?;
    let proxy = proxies
        .get(&id)
        .ok_or_else(|| format!("no proxy with id {id}"))?;
    match rest {
        ["delay", dir, ms] => {
            let ms: u64 = ms.parse().map_err(|_| format!("delay {ms:?} is not ms"))?;
            for d in dirs(dir)? {
                proxy.set_delay_dir(d, Duration::from_millis(ms));
            }
        }
        ["hold", dir] => dirs(dir)?.into_iter().for_each(|d| proxy.hold(d)),
        ["release", dir] => dirs(dir)?.into_iter().for_each(|d| proxy.release(d)),
        ["cut"] => proxy.cut(),
        ["blackhole"] => proxy.blackhole(),
        ["heal"] => proxy.heal(),
        _ => return Err(format!("unknown command {line:?}")),
    }
    Ok("ok".to_string())
}

fn main() {
    let mut proxies = HashMap::new();
    let stdout = io::stdout();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = run(&mut proxies, &line).unwrap_or_else(|e| format!("err {e}"));
        let mut out = stdout.lock();
        let _ = writeln!(out, "{reply}");
        let _ = out.flush();
    }
}
