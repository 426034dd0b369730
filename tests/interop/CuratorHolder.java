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
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        System.out.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            switch (line.trim()) {
                case "acquire":
                    mutex.acquire();
                    System.out.println("held");
                    break;
                case "try":
                    System.out.println(mutex.acquire(0, TimeUnit.MILLISECONDS) ? "held" : "busy");
                    break;
                case "release":
                    mutex.release();
                    System.out.println("released");
                    break;
                case "nodes":
                    List<String> names = new ArrayList<>();
                    for (String node : mutex.getParticipantNodes()) {
                        names.add(node.substring(node.lastIndexOf('/') + 1));
                    }
                    System.out.println("nodes " + String.join(",", names));
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
}
