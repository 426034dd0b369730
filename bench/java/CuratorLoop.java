// The peer of S13 (bench/src/scenarios/zookeeper.rs): Apache Curator's
// InterProcessMutex, the lock Java services take on ZooKeeper, measured by
// the same loops as our runtime. lock-bench compiles it with javac at run
// time (bench/src/curator.rs) and drives it by lines.
//
// Usage: java CuratorLoop <mode> <connect string> ...
//
//   uncontended <connect> <lock path> <warmup> <per block>
//       One thread: <warmup> unmeasured acquire + release pairs, then
//       `ready`. Each `block` line from stdin runs <per block> acquire +
//       release pairs (`lock <us>` each) and <per block> pairs of
//       `checkExists` of `/` on the same client (`exists2 <us>` each: two of
//       Curator's own round trips, as a lock pair takes two), then `done`;
//       the parent interleaves these blocks with its own, so that drift in
//       the machine's load hits both alike. Ends when stdin closes.
//
//   contend <connect> <lock path> <redis host:port> <counter key> <threads> <first id> <millis>
//       The S3 worker: prints `ready` once connected and warm, waits for
//       `go` on stdin, then <threads> threads (workers <first id>..) take
//       the lock over and over for <millis>, each with an InterProcessMutex
//       of its own on one shared client (one session per process, as our
//       runtime has). The body is a GET and a SET of the counter on the
//       data Redis, as in the Rust worker. Prints, as the Rust worker does,
//       `rec <worker> 0 <requested> <acquired> <released>` (µs since the
//       epoch) per acquisition, then `timeouts N`, `errors N`, `passed 0`
//       and `done`.
//
//   many <connect> <path prefix> <threads> <keys> <millis>
//       The S5 peer: prints `ready` once warm, waits for `go`, then
//       <threads> threads take pseudo-random locks of <keys> paths
//       (<path prefix><n>) with an empty body for <millis>; prints
//       `ops <acquire + release pairs>`, `seconds <elapsed>`, `errors N`
//       and `done`.
import java.io.BufferedInputStream;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorLoop {
    // How long one acquire may wait before it counts as a timeout (the
    // Rust worker's WAIT_LIMIT).
    static final long WAIT_LIMIT_MS = 30_000;
    // Upper bound on acquisitions per thread, whatever the duration.
    static final int MAX_PER_THREAD = 1_000_000;
    // Unmeasured pairs before `ready` (the JIT compiles the hot paths).
    static final int WARMUP = 200;

    static final PrintStream OUT =
        new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false, StandardCharsets.UTF_8);

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            usage();
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[1])
            .sessionTimeoutMs(30_000)
            .connectionTimeoutMs(10_000)
            .retryPolicy(new RetryNTimes(3, 100))
            .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("CuratorLoop: not connected to " + args[1]);
            System.exit(1);
        }
        try {
            switch (args[0]) {
                case "uncontended":
                    uncontended(client, args);
                    break;
                case "contend":
                    contend(client, args);
                    break;
                case "many":
                    many(client, args);
                    break;
                default:
                    usage();
            }
        } finally {
            OUT.flush();
            client.close();
        }
    }

    static void usage() {
        System.err.println("usage: CuratorLoop (uncontended|contend|many) <connect> ... (see the file's header)");
        System.exit(2);
    }

    // Microseconds since the Unix epoch on the system clock: comparable
    // with the Rust workers' timestamps on the same machine.
    static long nowUs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
    }

    // Blocks until the parent sends `go`.
    static void waitForGo() throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line = in.readLine();
        if (line == null || !line.trim().equals("go")) {
            throw new IOException("expected `go` from the parent, got " + line);
        }
    }

    static void say(String line) {
        OUT.println(line);
        OUT.flush();
    }

    static void uncontended(CuratorFramework client, String[] args) throws Exception {
        if (args.length != 5) {
            usage();
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[2]);
        int warmup = Integer.parseInt(args[3]);
        int perBlock = Integer.parseInt(args[4]);
        for (int i = 0; i < warmup; i++) {
            mutex.acquire();
            mutex.release();
            client.checkExists().forPath("/");
        }
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (!line.trim().equals("block")) {
                throw new IOException("expected `block` from the parent, got " + line);
            }
            StringBuilder out = new StringBuilder();
            for (int i = 0; i < perBlock; i++) {
                long start = System.nanoTime();
                mutex.acquire();
                mutex.release();
                out.append("lock ").append((System.nanoTime() - start) / 1_000.0).append('\n');
            }
            for (int i = 0; i < perBlock; i++) {
                long start = System.nanoTime();
                client.checkExists().forPath("/");
                client.checkExists().forPath("/");
                out.append("exists2 ").append((System.nanoTime() - start) / 1_000.0).append('\n');
            }
            OUT.print(out);
            say("done");
        }
    }

    static void contend(CuratorFramework client, String[] args) throws Exception {
        if (args.length != 8) {
            usage();
        }
        String path = args[2];
        String redis = args[3];
        String counter = args[4];
        int threads = Integer.parseInt(args[5]);
        int firstId = Integer.parseInt(args[6]);
        long millis = Long.parseLong(args[7]);

        // Warm up (connection, JIT) on a path of this process alone.
        InterProcessMutex warm = new InterProcessMutex(client, path + "-warmup-" + firstId);
        Redis warmRedis = new Redis(redis);
        for (int i = 0; i < WARMUP; i++) {
            warm.acquire();
            warmRedis.get(counter + ":warmup");
            warm.release();
        }
        warmRedis.close();

        List<Worker> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            workers.add(new Worker(firstId + t, new InterProcessMutex(client, path), new Redis(redis), counter));
        }
        say("ready");
        waitForGo();
        long end = System.nanoTime() + millis * 1_000_000L;
        List<Thread> running = new ArrayList<>();
        for (Worker w : workers) {
            w.end = end;
            Thread thread = new Thread(w, "worker-" + w.id);
            thread.start();
            running.add(thread);
        }
        long timeouts = 0;
        long errors = 0;
        StringBuilder out = new StringBuilder();
        for (int t = 0; t < threads; t++) {
            running.get(t).join();
            Worker w = workers.get(t);
            timeouts += w.timeouts;
            errors += w.errors;
            for (long[] r : w.records) {
                out.append("rec ").append(w.id).append(" 0 ")
                    .append(r[0]).append(' ').append(r[1]).append(' ').append(r[2]).append('\n');
            }
            w.redis.close();
        }
        out.append("timeouts ").append(timeouts).append('\n');
        out.append("errors ").append(errors).append('\n');
        out.append("passed 0\n");
        OUT.print(out);
        say("done");
    }

    // One contending thread: its own mutex object (so a watch event wakes
    // the thread it concerns, not every thread of the process) and its own
    // Redis connection for the body.
    static final class Worker implements Runnable {
        final int id;
        final InterProcessMutex mutex;
        final Redis redis;
        final String counter;
        long end;
        final List<long[]> records = new ArrayList<>();
        long timeouts;
        long errors;

        Worker(int id, InterProcessMutex mutex, Redis redis, String counter) {
            this.id = id;
            this.mutex = mutex;
            this.redis = redis;
            this.counter = counter;
        }

        public void run() {
            for (int i = 0; i < MAX_PER_THREAD && System.nanoTime() < end; i++) {
                long requested = nowUs();
                try {
                    if (!mutex.acquire(WAIT_LIMIT_MS, TimeUnit.MILLISECONDS)) {
                        timeouts++;
                        continue;
                    }
                } catch (Exception e) {
                    System.err.println("CuratorLoop worker " + id + ": acquire: " + e);
                    errors++;
                    continue;
                }
                long acquired = nowUs();
                try {
                    String value = redis.get(counter);
                    long n = value == null ? 0 : Long.parseLong(value);
                    redis.set(counter, Long.toString(n + 1));
                } catch (Exception e) {
                    System.err.println("CuratorLoop worker " + id + ": body: " + e);
                    errors++;
                }
                long released = nowUs();
                try {
                    mutex.release();
                } catch (Exception e) {
                    System.err.println("CuratorLoop worker " + id + ": release: " + e);
                    errors++;
                }
                records.add(new long[] {requested, acquired, released});
            }
        }
    }

    static void many(CuratorFramework client, String[] args) throws Exception {
        if (args.length != 6) {
            usage();
        }
        String prefix = args[2];
        int threads = Integer.parseInt(args[3]);
        int keys = Integer.parseInt(args[4]);
        long millis = Long.parseLong(args[5]);
        // One mutex object per (thread, key), made on first use: a thread
        // never shares one, as a task of ours never shares a lock request.
        List<ConcurrentHashMap<Integer, InterProcessMutex>> mutexes = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            mutexes.add(new ConcurrentHashMap<>());
        }
        InterProcessMutex warm = new InterProcessMutex(client, prefix + "warmup");
        for (int i = 0; i < WARMUP; i++) {
            warm.acquire();
            warm.release();
        }
        say("ready");
        waitForGo();
        AtomicLong ops = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        long start = System.nanoTime();
        long end = start + millis * 1_000_000L;
        List<Thread> running = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int thread = t;
            Thread th = new Thread(() -> {
                // xorshift64, seeded by the thread number.
                long x = 0x9E3779B97F4A7C15L * (thread + 1);
                ConcurrentHashMap<Integer, InterProcessMutex> mine = mutexes.get(thread);
                for (long n = 0; n < 10_000_000L && System.nanoTime() < end; n++) {
                    x ^= x << 13;
                    x ^= x >>> 7;
                    x ^= x << 17;
                    int key = (int) Long.remainderUnsigned(x, keys);
                    InterProcessMutex mutex = mine.computeIfAbsent(key, k -> new InterProcessMutex(client, prefix + k));
                    try {
                        if (mutex.acquire(WAIT_LIMIT_MS, TimeUnit.MILLISECONDS)) {
                            mutex.release();
                            ops.incrementAndGet();
                        } else {
                            errors.incrementAndGet();
                        }
                    } catch (Exception e) {
                        System.err.println("CuratorLoop many: " + e);
                        errors.incrementAndGet();
                    }
                }
            }, "many-" + t);
            th.start();
            running.add(th);
        }
        for (Thread th : running) {
            th.join();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        say("ops " + ops.get());
        say("seconds " + seconds);
        say("errors " + errors.get());
        say("done");
    }

    // The least of a Redis client the body needs: GET and SET over RESP.
    static final class Redis {
        final Socket socket;
        final InputStream in;
        final OutputStream out;

        Redis(String hostPort) throws IOException {
            int colon = hostPort.lastIndexOf(':');
            socket = new Socket(hostPort.substring(0, colon), Integer.parseInt(hostPort.substring(colon + 1)));
            socket.setTcpNoDelay(true);
            in = new BufferedInputStream(socket.getInputStream());
            out = socket.getOutputStream();
        }

        String get(String key) throws IOException {
            return command("GET", key);
        }

        void set(String key, String value) throws IOException {
            command("SET", key, value);
        }

        String command(String... parts) throws IOException {
            StringBuilder b = new StringBuilder();
            b.append('*').append(parts.length).append("\r\n");
            for (String p : parts) {
                byte[] bytes = p.getBytes(StandardCharsets.UTF_8);
                b.append('$').append(bytes.length).append("\r\n").append(p).append("\r\n");
            }
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            int kind = in.read();
            String line = readLine();
            switch (kind) {
                case '+':
                case ':':
                    return line;
                case '$': {
                    int length = Integer.parseInt(line);
                    if (length < 0) {
                        return null;
                    }
                    byte[] data = in.readNBytes(length + 2);
                    return new String(data, 0, length, StandardCharsets.UTF_8);
                }
                case '-':
                    throw new IOException("redis: " + line);
                default:
                    throw new IOException("redis: unexpected reply " + (char) kind + line);
            }
        }

        String readLine() throws IOException {
            StringBuilder b = new StringBuilder();
            for (int i = 0; i < 1_000_000; i++) {
                int c = in.read();
                if (c < 0) {
                    throw new IOException("redis closed the connection");
                }
                if (c == '\r') {
                    in.read(); // '\n'
                    return b.toString();
                }
                b.append((char) c);
            }
            throw new IOException("redis: reply line too long");
        }

        void close() throws IOException {
            socket.close();
        }
    }
}
