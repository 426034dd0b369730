// A Java service's side of the read-write interop test
// (tests/tests/zookeeper.rs): Apache Curator's InterProcessReadWriteLock on
// one lock path, driven by lines, as CuratorHolder.java drives its mutex.
//
// Usage: java CuratorRwHolder <connect string> <lock path>
// Prints `ready` once connected, then answers each line of stdin:
//   read, write          -> blocks until held, then `held`
//   try-read, try-write  -> `held` or `busy` (no wait)
//   release-read,
//   release-write        -> `released`
//   downgrade            -> (holding the write lock) takes the read lock
//                           and releases the write lock: `held`
//   nodes                -> `nodes <name>,<name>,...`: every node of the
//                           path, readers' and writers', in Curator's own
//                           order (holders first)
//   version              -> `version <curator-recipes version>`
//   exit                 -> ends
// Curator's locks are re-entrant per thread, and one thread reads these
// lines: a second `read` while holding one re-enters. A test that needs a
// second Java reader starts a second process.
import java.io.BufferedReader;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.LockInternals;
import org.apache.curator.framework.recipes.locks.StandardLockInternalsDriver;
import org.apache.curator.retry.RetryNTimes;

public class CuratorRwHolder {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0])
            .sessionTimeoutMs(4000)
            .connectionTimeoutMs(4000)
            .retryPolicy(new RetryNTimes(3, 100))
            .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("error not connected");
            return;
        }
        InterProcessReadWriteLock lock = new InterProcessReadWriteLock(client, args[1]);
        InterProcessMutex read = lock.readLock();
        InterProcessMutex write = lock.writeLock();
        System.out.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            switch (line.trim()) {
                case "read":
                    read.acquire();
                    System.out.println("held");
                    break;
                case "write":
                    write.acquire();
                    System.out.println("held");
                    break;
                case "try-read":
                    System.out.println(read.acquire(0, TimeUnit.MILLISECONDS) ? "held" : "busy");
                    break;
                case "try-write":
                    System.out.println(write.acquire(0, TimeUnit.MILLISECONDS) ? "held" : "busy");
                    break;
                case "release-read":
                    read.release();
                    System.out.println("released");
                    break;
                case "release-write":
                    write.release();
                    System.out.println("released");
                    break;
                case "downgrade":
                    read.acquire();
                    write.release();
                    System.out.println("held");
                    break;
                case "nodes":
                    // (Each lock's getParticipantNodes lists only its own
                    // name's nodes.) Sorted by Curator's own routine with
                    // its read-write lock's key: the text after __READ__,
                    // then after __WRIT__ (SortingLockInternalsDriver).
                    StandardLockInternalsDriver driver = new StandardLockInternalsDriver();
                    List<String> names = LockInternals.getSortedChildren(
                        "__WRIT__",
                        (name, lockName) -> driver.fixForSorting(
                            driver.fixForSorting(name, "__READ__"), "__WRIT__"),
                        client.getChildren().forPath(args[1]));
                    System.out.println("nodes " + String.join(",", names));
                    break;
                case "version":
                    System.out.println("version " + curatorVersion());
                    break;
                case "exit":
                    client.close();
                    return;
                default:
                    System.out.println("error unknown command " + line);
            }
            System.out.flush();
        }
        client.close();
    }

    /// The version of the curator-recipes jar in use, from its Maven
    /// properties (`unknown` when the jar has none).
    private static String curatorVersion() throws Exception {
        String resource = "/META-INF/maven/org.apache.curator/curator-recipes/pom.properties";
        try (InputStream props = InterProcessReadWriteLock.class.getResourceAsStream(resource)) {
            if (props == null) {
                return "unknown";
            }
            Properties properties = new Properties();
            properties.load(props);
            return properties.getProperty("version", "unknown");
        }
    }
}
