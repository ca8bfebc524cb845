package ferrolock.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.redisson.config.ShardedSubscriptionMode;

/**
 * A Redisson client in cluster mode, scripted one command per stdin line; every RLock call runs
 * on the main thread (Redisson's owner is "uuid:threadId"). Args: seed URL, "sharded" (Redisson's
 * default, AUTO) or "classic" (OFF). Replies one line each:
 *   try KEY            -> "try KEY true|false"          (tryLock(0, 120 s))
 *   lock KEY LEASE_MS  -> "locked KEY" once granted     (lock(); LEASE_MS -1 = watchdog)
 *   unlock KEY         -> "unlocked KEY"
 *   quit
 */
public final class Client {
    public static void main(String[] args) throws Exception {
        Config config = new Config();
        config.useClusterServers()
                .addNodeAddress(args[0])
                .setShardedSubscriptionMode(
                        args[1].equals("classic") ? ShardedSubscriptionMode.OFF : ShardedSubscriptionMode.AUTO);
        RedissonClient redisson = Redisson.create(config);
        System.out.println("ready " + redisson.getId());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            String[] c = line.trim().split(" ");
            switch (c[0]) {
                case "try" -> System.out.println(
                        "try " + c[1] + " " + redisson.getLock(c[1]).tryLock(0, 120, TimeUnit.SECONDS));
                case "lock" -> {
                    RLock lock = redisson.getLock(c[1]);
                    long lease = Long.parseLong(c[2]);
                    if (lease < 0) lock.lock(); else lock.lock(lease, TimeUnit.MILLISECONDS);
                    System.out.println("locked " + c[1]);
                }
                case "unlock" -> {
                    redisson.getLock(c[1]).unlock();
                    System.out.println("unlocked " + c[1]);
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
}
