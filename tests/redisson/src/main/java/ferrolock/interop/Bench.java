package ferrolock.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * One worker process of ferrolock-bench's "rw" scenario (bench/src/rw.rs), the Redisson side of
 * its timed loops. Args: URL (one server), KIND ("rw:PERCENT_READS" on RReadWriteLock KEY, or
 * "sem:PERMITS" on RPermitExpirableSemaphore KEY), KEY, OUT. It connects, takes and frees the
 * hold once (so the first timed acquire pays no connection), prints "ready", then reads
 * "START_NS END_NS" (CLOCK_MONOTONIC, which System.nanoTime reads on Linux, so the bench compares
 * the timestamps with its own workers') and loops from START_NS to END_NS: acquire (blocking,
 * Redisson's own waiting), a 1 ms sleep, release. It writes one line per section in the format
 * of the bench's own workers: "t0 t1 t2 t3 1 0 0 SIDE" (acquire called, granted, release called,
 * release returned; SIDE 1 read, 2 write, 3 permit).
 */
public final class Bench {
    public static void main(String[] args) throws Exception {
        String url = args[0], kind = args[1], key = args[2];
        Path out = Path.of(args[3]);
        Config config = new Config();
        config.useSingleServer().setAddress(url);
        RedissonClient redisson = Redisson.create(config);
        try {
            run(redisson, kind, key, out);
        } finally {
            redisson.shutdown();
        }
    }

    private static void run(RedissonClient redisson, String kind, String key, Path out) throws Exception {
        String[] k = kind.split(":");
        int n = Integer.parseInt(k[1]);
        RReadWriteLock rw = redisson.getReadWriteLock(key);
        RPermitExpirableSemaphore sem = redisson.getPermitExpirableSemaphore(key);
        boolean semaphore = k[0].equals("sem");
        if (semaphore) {
            sem.trySetPermits(n);
            sem.release(sem.acquire(10, TimeUnit.SECONDS));
        } else if (k[0].equals("rw")) {
            rw.readLock().lock();
            rw.readLock().unlock();
        } else {
            throw new IllegalArgumentException("unknown kind " + kind);
        }
        System.out.println("ready");
        System.out.flush();
        String[] window = new BufferedReader(new InputStreamReader(System.in)).readLine().trim().split(" ");
        long start = Long.parseLong(window[0]), end = Long.parseLong(window[1]);
        while (System.nanoTime() < start) {
            Thread.sleep(Math.max(0, (start - System.nanoTime()) / 1_000_000), 0);
        }
        StringBuilder log = new StringBuilder();
        while (System.nanoTime() < end) {
            long t0 = System.nanoTime(), t1, t2, t3;
            int side;
            if (semaphore) {
                side = 3;
                String id = sem.acquire(10, TimeUnit.SECONDS);
                t1 = System.nanoTime();
                Thread.sleep(1);
                t2 = System.nanoTime();
                sem.release(id);
            } else {
                boolean read = ThreadLocalRandom.current().nextInt(100) < n;
                side = read ? 1 : 2;
                RLock lock = read ? rw.readLock() : rw.writeLock();
                lock.lock();
                t1 = System.nanoTime();
                Thread.sleep(1);
                t2 = System.nanoTime();
                lock.unlock();
            }
            t3 = System.nanoTime();
            log.append(t0).append(' ').append(t1).append(' ').append(t2).append(' ').append(t3)
                    .append(" 1 0 0 ").append(side).append('\n');
        }
        Files.writeString(out, log);
    }
}
