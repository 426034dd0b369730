// A Java service's side of the interop test (tests/tests/zookeeper.rs):
// Apache Curator's InterProcessMutex on one lock path, driven by lines.
//
// Usage: java CuratorHolder <connect string> <lock path>
// Prints `ready` once connected, then answers each line of stdin:
//   acquire  -> blocks until held, then `held`
//   try      -> `held` or `busy` (no wait)
//   release  -> `released`
//   nodes    -> `nodes <name>,<name>,...`: the contenders in Curator's own
//               order (getParticipantNodes), holder first
//   exit     -> ends
// The class Holders below is what CuratorRwHolder.java shares with it (the
// test compiles the two files together).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorHolder {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = Holders.connect(args[0]);
        if (client == null) {
            return;
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        Holders.serve(client, command -> {
            switch (command) {
                case "acquire" -> Holders.acquire(mutex);
                case "try" -> Holders.tryAcquire(mutex);
                case "release" -> Holders.release(mutex);
                case "nodes" -> {
                    List<String> names = new ArrayList<>();
                    for (String node : mutex.getParticipantNodes()) {
                        names.add(node.substring(node.lastIndexOf('/') + 1));
                    }
                    System.out.println("nodes " + String.join(",", names));
                }
                default -> {
                    return false;
                }
            }
            return true;
        });
    }
}

// What both holders share: the client, and the loop that reads stdin, a
// command a line, with the answers every lock gives.
final class Holders {
    // Answers one command; false when it knows no such command.
    interface Commands {
        boolean answer(String command) throws Exception;
    }

    // A started client of `connectString`; null (and `error not
    // connected` printed) when it did not connect within 20 s.
    static CuratorFramework connect(String connectString) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(connectString)
            .sessionTimeoutMs(4000)
            .connectionTimeoutMs(4000)
            .retryPolicy(new RetryNTimes(3, 100))
            .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("error not connected");
            return null;
        }
        return client;
    }

    // Prints `ready`, then answers each line of stdin by `commands` until
    // `exit` or the end of stdin; then closes `client`.
    static void serve(CuratorFramework client, Commands commands) throws Exception {
        System.out.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String command = line.trim();
            if (command.equals("exit")) {
                break;
            }
            if (!commands.answer(command)) {
                System.out.println("error unknown command " + line);
            }
            System.out.flush();
        }
        client.close();
    }

    // Blocks until `lock` is held, then `held`.
    static void acquire(InterProcessMutex lock) throws Exception {
        lock.acquire();
        System.out.println("held");
    }

    // `held` or `busy`, without waiting.
    static void tryAcquire(InterProcessMutex lock) throws Exception {
        System.out.println(lock.acquire(0, TimeUnit.MILLISECONDS) ? "held" : "busy");
    }

    // Releases `lock`, then `released`.
    static void release(InterProcessMutex lock) throws Exception {
        lock.release();
        System.out.println("released");
    }
}
