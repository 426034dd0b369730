// A Java service's side of the multi-key interop test
// (tests/tests/zookeeper.rs): Apache Curator's InterProcessMultiLock over
// the given lock paths, in the order given, driven by lines.
//
// Usage: java CuratorMultiHolder <connect string> <lock path> <lock path>...
// Prints `ready` once connected, then answers each line of stdin:
//   acquire  -> blocks until every path is held, then `held`
//   try      -> `held` (every path) or `busy` (none kept), without waiting
//   release  -> `released`
//   exit     -> ends
// Compiled with CuratorHolder.java, whose class Holders it uses.
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.locks.InterProcessMultiLock;

public class CuratorMultiHolder {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = Holders.connect(args[0]);
        if (client == null) {
            return;
        }
        List<String> paths = Arrays.asList(args).subList(1, args.length);
        InterProcessMultiLock lock = new InterProcessMultiLock(client, paths);
        Holders.serve(client, command -> {
            switch (command) {
                case "acquire" -> {
                    lock.acquire();
                    System.out.println("held");
                }
                case "try" -> System.out.println(
                    lock.acquire(0, TimeUnit.MILLISECONDS) ? "held" : "busy");
                case "release" -> {
                    lock.release();
                    System.out.println("released");
                }
                default -> {
                    return false;
                }
            }
            return true;
        });
    }
}
