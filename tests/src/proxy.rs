//! A TCP proxy in front of a `redis-server` that the test drives: stall the
//! traffic, slow it down, cut connections, refuse new ones, or cut a
//! connection at the moment a given command goes out.
//!
//! Killing or freezing the server hits every client at once; the proxy hits
//! one client's connection (one process's view of the network) and at exact
//! points of the protocol, which a server-side fault cannot.
//!
//! Each connection has two directions; each direction is a reader that
//! stamps every chunk with the time it was read and queues it, and a writer
//! that forwards the queue in order. The writer parks on a `watch` while the
//! proxy is stalled (the bytes stay queued, nothing is dropped) and waits out
//! the configured delay counted from the chunk's arrival, so a slow proxy
//! delays each chunk by the delay instead of adding the delays up.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[cfg(test)]
mod tests;

/// How long the proxy tries to reach the upstream server for a new client.
const UPSTREAM_CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// Bytes read from a socket at once.
const CHUNK: usize = 16 * 1024;

/// A fault-injecting TCP proxy on a free loopback port in front of
/// `127.0.0.1:<upstream>`. Dropping it stops the listener and closes every
/// connection.
///
/// ```no_run
/// # async fn demo() {
/// let proxy = lock_tests::FaultProxy::start(6379).await;
/// let url = proxy.url(); // give this to the client under test
/// proxy.stall(); // nothing flows ...
/// proxy.resume(); // ... until now, held bytes first
/// # }
/// ```
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

/// State the proxy handle shares with its connection tasks.
struct Shared {
    upstream_port: u16,
    stalled: watch::Sender<bool>,
    delay: Mutex<Option<Duration>>,
    refuse: std::sync::atomic::AtomicBool,
    /// Bumped to close every connection open at that moment.
    kill: watch::Sender<u64>,
    /// The armed `drop_at_command` pattern: `$<len>\r\n<NAME>\r\n`, upper case.
    drop_at: Mutex<Option<Vec<u8>>>,
    dropped_at_command: AtomicU64,
    /// When each `drop_at_command` fired.
    fired_at: Mutex<Vec<std::time::Instant>>,
    connections: AtomicUsize,
}

impl FaultProxy {
    /// Starts listening on `127.0.0.1:<free port>`, forwarding to
    /// `127.0.0.1:upstream_port`. Must be called inside a tokio runtime: the
    /// proxy's tasks are spawned on it.
    pub async fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on a free loopback port");
        let port = listener.local_addr().expect("proxy local address").port();
        let shared = Arc::new(Shared {
            upstream_port,
            stalled: watch::Sender::new(false),
            delay: Mutex::new(None),
            refuse: std::sync::atomic::AtomicBool::new(false),
            kill: watch::Sender::new(0),
            drop_at: Mutex::new(None),
            dropped_at_command: AtomicU64::new(0),
            fired_at: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        });
        let acceptor = tokio::spawn(accept_loop(listener, shared.clone()));
        FaultProxy {
            port,
            shared,
            acceptor,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding in both directions on every connection, present and
    /// future: bytes are held (not dropped) and the connections stay open.
    pub fn stall(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Forwards again, the held bytes first, in order.
    pub fn resume(&self) {
        self.shared.stalled.send_replace(false);
    }

    /// Delays each forwarded chunk by `delay` from its arrival (`None`: no
    /// delay); the order of the bytes is kept.
    pub fn slow(&self, delay: Option<Duration>) {
        *self.shared.delay.lock().expect("proxy delay lock") = delay;
    }

    /// Closes every current connection at once, both sides.
    pub fn drop_connections(&self) {
        self.shared.kill.send_modify(|epoch| *epoch += 1);
    }

    /// While `true`, new client connections are closed right after accept;
    /// existing ones are not affected.
    pub fn refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// One-shot: the next client-to-server data that contains the RESP
    /// command `command` (case-insensitive, e.g. `"SUBSCRIBE"`) closes its
    /// connection without forwarding that data.
    pub fn drop_at_command(&self, command: &str) {
        let name = command.to_ascii_uppercase();
        let pattern = format!("${}\r\n{name}\r\n", name.len()).into_bytes();
        *self.shared.drop_at.lock().expect("proxy drop_at lock") = Some(pattern);
    }

    /// Client connections open right now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many times [`drop_at_command`](Self::drop_at_command) fired.
    pub fn dropped_at_command(&self) -> u64 {
        self.shared.dropped_at_command.load(Ordering::SeqCst)
    }

    /// When each [`drop_at_command`](Self::drop_at_command) fired, oldest
    /// first (`std::time::Instant`, which is `CLOCK_MONOTONIC` on Linux).
    pub fn dropped_at_command_times(&self) -> Vec<std::time::Instant> {
        self.shared
            .fired_at
            .lock()
            .expect("proxy fired_at lock")
            .clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.drop_connections();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors and the like: try again shortly rather
            // than spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if shared.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        // Subscribe before spawning, so a drop_connections() right after
        // this accept reaches the new connection too.
        let kill = shared.kill.subscribe();
        shared.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(serve(client, shared.clone(), kill));
    }
}

/// A direction stopped early (a socket error, or the armed command was
/// seen): the whole connection closes.
struct Close;

/// One client connection: forwards both directions until both ends are
/// done, a socket fails, the armed command is seen, or the proxy kills it.
async fn serve(client: TcpStream, shared: Arc<Shared>, mut kill: watch::Receiver<u64>) {
    let upstream = tokio::select! {
        _ = kill.changed() => None,
        connected = tokio::time::timeout(
            UPSTREAM_CONNECT_LIMIT,
            TcpStream::connect(("127.0.0.1", shared.upstream_port)),
        ) => connected.ok().and_then(Result::ok),
    };
    let Some(upstream) = upstream else {
        // Upstream down: the client sees its connection closed.
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    {
        let to_server = direction(&mut client_read, &mut upstream_write, &shared, true);
        let to_client = direction(&mut upstream_read, &mut client_write, &shared, false);
        tokio::select! {
            _ = kill.changed() => {}
            _ = async { tokio::try_join!(to_server, to_client) } => {}
        }
    }
    // Counted out before the sockets close, so a client that sees its
    // connection end also sees the count without it.
    shared.connections.fetch_sub(1, Ordering::SeqCst);
    drop((client_read, client_write, upstream_read, upstream_write));
}

/// One direction of a connection: a reader queueing stamped chunks and a
/// writer forwarding them. `Ok` when the source ended and everything read
/// was forwarded.
async fn direction(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    shared: &Shared,
    client_to_server: bool,
) -> Result<(), Close> {
    let (queue, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await.map_err(|_| Close)?;
            if n == 0 {
                return Ok::<(), Close>(());
            }
            let chunk = buf[..n].to_vec();
            if client_to_server && shared.take_drop_at(&mut tail, &chunk) {
                return Err(Close);
            }
            if queue.send((Instant::now(), chunk)).is_err() {
                return Err(Close);
            }
        }
        // The queue's sender drops here: the writer ends after the last chunk.
    };
    let writer = async {
        let mut stalled = shared.stalled.subscribe();
        while let Some((read_at, chunk)) = queued.recv().await {
            shared.wait_until_forwardable(&mut stalled, read_at).await;
            to.write_all(&chunk).await.map_err(|_| Close)?;
        }
        let _ = to.shutdown().await;
        Ok::<(), Close>(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

impl Shared {
    /// Waits until the proxy is not stalled and the chunk read at `read_at`
    /// has been delayed as configured (re-checking the stall after the delay,
    /// so a stall that began meanwhile still holds the chunk).
    async fn wait_until_forwardable(&self, stalled: &mut watch::Receiver<bool>, read_at: Instant) {
        loop {
            // Err only when the sender is gone, which it is not while `self` lives.
            let _ = stalled.wait_for(|s| !*s).await;
            let delay = *self.delay.lock().expect("proxy delay lock");
            match delay {
                Some(d) if Instant::now() < read_at + d => {
                    tokio::time::sleep_until(read_at + d).await;
                }
                _ => return,
            }
            if !*stalled.borrow() {
                return;
            }
        }
    }

    /// Whether `chunk` (after the `tail` of this connection's earlier data)
    /// holds the armed command; if so the arm is used up. Keeps `tail` as
    /// the last bytes seen, so a command split across chunks is found too.
    fn take_drop_at(&self, tail: &mut Vec<u8>, chunk: &[u8]) -> bool {
        let mut armed = self.drop_at.lock().expect("proxy drop_at lock");
        let Some(pattern) = armed.as_ref() else {
            tail.clear();
            return false;
        };
        let mut seen = std::mem::take(tail);
        seen.extend_from_slice(chunk);
        let found = seen
            .windows(pattern.len())
            .any(|w| w.eq_ignore_ascii_case(pattern));
        if found {
            *armed = None;
            self.fired_at
                .lock()
                .expect("proxy fired_at lock")
                .push(std::time::Instant::now());
            self.dropped_at_command.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        let keep = pattern.len().saturating_sub(1).min(seen.len());
        *tail = seen.split_off(seen.len() - keep);
        false
    }
}
