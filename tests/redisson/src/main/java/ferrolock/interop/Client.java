package ferrolock.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.redisson.config.ShardedSubscriptionMode;

/**
 * A Redisson client, scripted one command per stdin line; every lock call runs on the main thread
 * (Redisson's owner is "uuid:threadId"). Args: a URL, then "sharded" (cluster mode, Redisson's
 * default AUTO), "classic" (cluster mode, OFF) or "single" (one server). Replies one line each:
 *   try KEY            -> "try KEY true|false"          (tryLock(0, 120 s))
 *   lock KEY LEASE_MS  -> "locked KEY" once granted     (lock(); LEASE_MS -1 = watchdog)
 *   unlock KEY         -> "unlocked KEY"
 * The same with an "r" or "w" in front (rtry, rlock, runlock, wtry, ...) on the RReadWriteLock
 * KEY's read or write lock; the reply's first word carries the same prefix ("rlocked KEY").
 * RPermitExpirableSemaphore NAME (commands starting with "s", checked first):
 *   ssetpermits NAME N              -> "ssetpermits NAME true|false"  (trySetPermits(N))
 *   sacquire NAME COUNT LEASE_MS    -> "sacquire NAME ID,ID,..." or "sacquire NAME none"
 *                                      (tryAcquire(COUNT, 0, LEASE_MS ms); ids as Redisson shows them)
 *   srelease NAME ID,ID,...         -> "sreleased NAME"
 *   savailable NAME                 -> "savailable NAME N"
 *   quit
 */
public final class Client {
    public static void main(String[] args) throws Exception {
        Config config = new Config();
        if (args[1].equals("single")) {
            config.useSingleServer().setAddress(args[0]);
        } else {
            config.useClusterServers()
                    .addNodeAddress(args[0])
                    .setShardedSubscriptionMode(
                            args[1].equals("classic") ? ShardedSubscriptionMode.OFF : ShardedSubscriptionMode.AUTO);
        }
        RedissonClient redisson = Redisson.create(config);
        System.out.println("ready " + redisson.getId());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            String[] c = line.trim().split(" ");
            if (c[0].startsWith("s")) {
                System.out.println(semaphore(redisson, c));
                System.out.flush();
                continue;
            }
            String kind = c[0].startsWith("r") || c[0].startsWith("w") ? c[0].substring(0, 1) : "";
            switch (c[0].substring(kind.length())) {
                case "try" -> System.out.println(
                        kind + "try " + c[1] + " " + lockOf(redisson, kind, c[1]).tryLock(0, 120, TimeUnit.SECONDS));
                case "lock" -> {
                    RLock lock = lockOf(redisson, kind, c[1]);
                    long lease = Long.parseLong(c[2]);
                    if (lease < 0) lock.lock(); else lock.lock(lease, TimeUnit.MILLISECONDS);
                    System.out.println(kind + "locked " + c[1]);
                }
                case "unlock" -> {
                    lockOf(redisson, kind, c[1]).unlock();
                    System.out.println(kind + "unlocked " + c[1]);
                }
                case "quit" -> {
                    redisson.shutdown();
                    return;
                }
                default -> System.out.println("error unknown command " + line);
            }
            System.out.flush();
        }
        redisson.shutdown();
    }

    private static String semaphore(RedissonClient redisson, String[] c) throws InterruptedException {
        var s = redisson.getPermitExpirableSemaphore(c[1]);
        return switch (c[0]) {
            case "ssetpermits" -> "ssetpermits " + c[1] + " " + s.trySetPermits(Integer.parseInt(c[2]));
            case "sacquire" -> {
                List<String> ids = s.tryAcquire(Integer.parseInt(c[2]), 0, Long.parseLong(c[3]), TimeUnit.MILLISECONDS);
                yield "sacquire " + c[1] + " " + (ids == null || ids.isEmpty() ? "none" : String.join(",", ids));
            }
            case "srelease" -> {
                s.release(List.of(c[2].split(",")));
                yield "sreleased " + c[1];
            }
            case "savailable" -> "savailable " + c[1] + " " + s.availablePermits();
            default -> "error unknown command " + String.join(" ", c);
        };
    }

    /** "" the RLock, "r" or "w" the RReadWriteLock's read or write lock. */
    private static RLock lockOf(RedissonClient redisson, String kind, String key) {
        return switch (kind) {
            case "r" -> redisson.getReadWriteLock(key).readLock();
            case "w" -> redisson.getReadWriteLock(key).writeLock();
            default -> redisson.getLock(key);
        };
    }
}
