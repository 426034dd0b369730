//! The fault proxy itself: what each fault does to the bytes between a
//! client and the test `redis-server` (the tests of the harness, beside
//! it, not among the lock's guarantees).

use std::time::{Duration, Instant};

use super::FaultProxy;
use crate::redis;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// A raw RESP connection through the proxy.
async fn connect(proxy: &FaultProxy) -> TcpStream {
    TcpStream::connect(("127.0.0.1", proxy.port()))
        .await
        .expect("connect to the proxy")
}

/// Sends a PING through `con` and expects its PONG.
async fn ping(con: &mut TcpStream) {
    con.write_all(PING).await.unwrap();
    expect_reply(con, b"+PONG\r\n").await;
}

/// Reads until `expected` arrived (at most 5 s); panics on anything else.
async fn expect_reply(con: &mut TcpStream, expected: &[u8]) {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    tokio::time::timeout(Duration::from_secs(5), async {
        while got.len() < expected.len() {
            let n = con.read(&mut buf).await.expect("read through the proxy");
            assert!(n > 0, "connection closed after {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no full reply within 5 s, got {got:?}"));
    assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(&got));
}

/// Reads until the proxy closes the connection (at most 5 s); returns the
/// bytes that came before.
async fn expect_closed(con: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match con.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the proxy did not close the connection within 5 s");
    got
}

fn subscribe(channel: &str) -> Vec<u8> {
    format!(
        "*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{channel}\r\n",
        channel.len()
    )
    .into_bytes()
}

async fn numsub(channel: &str) -> i64 {
    let mut con = redis().connection().await;
    let reply: (String, i64) = ::redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMSUB");
    reply.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_both_ways_and_counts_connections() {
    let proxy = FaultProxy::start(redis().port()).await;
    assert!(proxy.url().ends_with(&format!(":{}", proxy.port())));
    let mut first = connect(&proxy).await;
    let mut second = connect(&proxy).await;
    first.write_all(PING).await.unwrap();
    second.write_all(PING).await.unwrap();
    expect_reply(&mut first, b"+PONG\r\n").await;
    expect_reply(&mut second, b"+PONG\r\n").await;
    assert_eq!(proxy.connections(), 2);
    drop(first);
    // The other one still works after its neighbour left.
    ping(&mut second).await;
}

/// While stalled, a PING's reply is held; `resume` delivers it, in order
/// with a second PING sent during the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_holds_a_ping_reply_until_resume() {
    let proxy = FaultProxy::start(redis().port()).await;
    let mut con = connect(&proxy).await;
    ping(&mut con).await;

    proxy.stall();
    con.write_all(PING).await.unwrap();
    con.write_all(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(400), con.read(&mut buf)).await;
    assert!(early.is_err(), "bytes came through a stall: {early:?}");
    assert_eq!(proxy.connections(), 1, "a stall must keep the connection");

    proxy.resume();
    expect_reply(&mut con, b"+PONG\r\n$2\r\nhi\r\n").await;
}

/// A connection opened during a stall is accepted but stalled too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_are_stalled_too() {
    let proxy = FaultProxy::start(redis().port()).await;
    proxy.stall();
    let mut con = connect(&proxy).await;
    con.write_all(PING).await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), con.read(&mut buf)).await;
    assert!(early.is_err(), "bytes came through a stall: {early:?}");
    proxy.resume();
    expect_reply(&mut con, b"+PONG\r\n").await;
}

/// `drop_at_command("subscribe")` lets earlier commands through, closes the
/// connection at the SUBSCRIBE without sending it to Redis, and fires once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_at_command_closes_on_subscribe_and_not_before() {
    let proxy = FaultProxy::start(redis().port()).await;
    let channel = format!("proxy-test-{}", std::process::id());
    proxy.drop_at_command("subscribe");
    let mut con = connect(&proxy).await;
    ping(&mut con).await;
    assert_eq!(proxy.dropped_at_command(), 0);

    con.write_all(&subscribe(&channel)).await.unwrap();
    let before_close = expect_closed(&mut con).await;
    assert!(before_close.is_empty(), "got {before_close:?}");
    assert_eq!(proxy.dropped_at_command(), 1);
    assert_eq!(numsub(&channel).await, 0, "the SUBSCRIBE reached Redis");
    assert_eq!(proxy.connections(), 0);

    // One-shot: the next SUBSCRIBE goes through.
    let mut again = connect(&proxy).await;
    again.write_all(&subscribe(&channel)).await.unwrap();
    let reply = format!(
        "*3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:1\r\n",
        channel.len()
    );
    expect_reply(&mut again, reply.as_bytes()).await;
    assert_eq!(numsub(&channel).await, 1);
    assert_eq!(proxy.dropped_at_command(), 1);
}

/// A command split over two writes is still found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_at_command_sees_a_command_split_across_writes() {
    let proxy = FaultProxy::start(redis().port()).await;
    proxy.drop_at_command("EVALSHA");
    let mut con = connect(&proxy).await;
    con.write_all(b"*3\r\n$7\r\nEVAL").await.unwrap();
    // Let the first half be read as its own chunk.
    con.flush().await.unwrap();
    tokio::task::yield_now().await;
    con.write_all(b"SHA\r\n$40\r\n").await.unwrap();
    expect_closed(&mut con).await;
    assert_eq!(proxy.dropped_at_command(), 1);
}

/// While refusing, new connections are closed at once and old ones live on;
/// after `refuse(false)` new ones work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_new_connections_only() {
    let proxy = FaultProxy::start(redis().port()).await;
    let mut old = connect(&proxy).await;
    ping(&mut old).await;

    proxy.refuse(true);
    let mut refused = connect(&proxy).await;
    let _ = refused.write_all(PING).await;
    let got = expect_closed(&mut refused).await;
    assert!(got.is_empty(), "a refused connection got {got:?}");
    ping(&mut old).await;
    assert_eq!(proxy.connections(), 1);

    proxy.refuse(false);
    let mut fresh = connect(&proxy).await;
    ping(&mut fresh).await;
}

/// `drop_connections` closes every open connection; new ones work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_connections_closes_every_connection() {
    let proxy = FaultProxy::start(redis().port()).await;
    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    for con in [&mut a, &mut b] {
        ping(con).await;
    }
    assert_eq!(proxy.connections(), 2);
    proxy.drop_connections();
    expect_closed(&mut a).await;
    expect_closed(&mut b).await;
    assert_eq!(proxy.connections(), 0);
    let mut c = connect(&proxy).await;
    ping(&mut c).await;
}

/// `slow` delays each chunk (both directions, so a round trip takes at
/// least twice the delay) and `slow(None)` ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_delays_each_chunk() {
    let proxy = FaultProxy::start(redis().port()).await;
    let mut con = connect(&proxy).await;
    proxy.slow(Some(Duration::from_millis(150)));
    let sent = Instant::now();
    ping(&mut con).await;
    let took = sent.elapsed();
    assert!(took >= Duration::from_millis(300), "round trip {took:?}");
    assert!(took < Duration::from_secs(2), "round trip {took:?}");
    proxy.slow(None);
    let sent = Instant::now();
    ping(&mut con).await;
    assert!(sent.elapsed() < Duration::from_millis(150));
}

/// Dropping the proxy closes its connections and stops listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_closes_everything() {
    let proxy = FaultProxy::start(redis().port()).await;
    let port = proxy.port();
    let mut con = connect(&proxy).await;
    ping(&mut con).await;
    drop(proxy);
    expect_closed(&mut con).await;
    // The listener is gone once the aborted acceptor is dropped; a connect
    // is refused (bounded retries while the abort lands).
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "the proxy still listens after drop");
}
