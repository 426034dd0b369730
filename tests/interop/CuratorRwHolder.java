// A Java service's side of the read-write interop test
// (tests/tests/zookeeper.rs): Apache Curator's InterProcessReadWriteLock on
// one lock path, driven by lines, as CuratorHolder.java drives its mutex
// (with its class Holders: the test compiles the two files together).
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
import java.io.InputStream;
import java.util.List;
import java.util.Properties;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.LockInternals;
import org.apache.curator.framework.recipes.locks.StandardLockInternalsDriver;

public class CuratorRwHolder {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = Holders.connect(args[0]);
        if (client == null) {
            return;
        }
        InterProcessReadWriteLock lock = new InterProcessReadWriteLock(client, args[1]);
        InterProcessMutex read = lock.readLock();
        InterProcessMutex write = lock.writeLock();
        Holders.serve(client, command -> {
            switch (command) {
                case "read" -> Holders.acquire(read);
                case "write" -> Holders.acquire(write);
                case "try-read" -> Holders.tryAcquire(read);
                case "try-write" -> Holders.tryAcquire(write);
                case "release-read" -> Holders.release(read);
                case "release-write" -> Holders.release(write);
                case "downgrade" -> {
                    read.acquire();
                    write.release();
                    System.out.println("held");
                }
                case "nodes" -> System.out.println("nodes " + String.join(",", sorted(client, args[1])));
                case "version" -> System.out.println("version " + curatorVersion());
                default -> {
                    return false;
                }
            }
            return true;
        });
    }

    /// Every node of `path`, readers' and writers' (each lock's
    /// getParticipantNodes lists only its own name's nodes), sorted by
    /// Curator's own routine with its read-write lock's key: the text
    /// after __READ__, then after __WRIT__ (SortingLockInternalsDriver).
    private static List<String> sorted(CuratorFramework client, String path) throws Exception {
        StandardLockInternalsDriver driver = new StandardLockInternalsDriver();
        return LockInternals.getSortedChildren(
            "__WRIT__",
            (name, lockName) -> driver.fixForSorting(
                driver.fixForSorting(name, "__READ__"), "__WRIT__"),
            client.getChildren().forPath(path));
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
