//! A very small HTTP/1.1 client over a tokio `TcpStream`, for the load mode
//! and the tests: one request per connection (`Connection: close`), body
//! read to the end. Enough for this service; not a general client.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request may take, connect to last byte.
const REQUEST_LIMIT: Duration = Duration::from_secs(60);

/// A response: status code and body.
#[derive(Debug)]
pub struct Response {
    /// The status code (200, 409, …).
    pub status: u16,
    /// The body as text.
    pub body: String,
}

/// Sends `method path` to `base` (`http://host:port`) and reads the answer.
pub async fn request(base: &str, method: &str, path: &str) -> io::Result<Response> {
    tokio::time::timeout(REQUEST_LIMIT, send(base, method, path))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{method} {path}: no answer"),
            )
        })?
}

async fn send(base: &str, method: &str, path: &str) -> io::Result<Response> {
    let host = base
        .strip_prefix("http://")
        .ok_or_else(|| invalid(format!("not an http:// URL: {base}")))?
        .trim_end_matches('/');
    let mut stream = TcpStream::connect(host).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&String::from_utf8_lossy(&raw))
}

/// Status line, headers, and a plain or chunked body.
fn parse(raw: &str) -> io::Result<Response> {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers".to_owned()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line: {head}")))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok(Response { status, body })
}

/// The data of a chunked body (`<hex size>\r\n<data>\r\n…0\r\n\r\n`).
fn dechunk(mut body: &str) -> io::Result<String> {
    let mut data = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| invalid("truncated chunk".to_owned()))?;
        let size = usize::from_str_radix(size.trim(), 16)
            .map_err(|_| invalid(format!("bad chunk size {size}")))?;
        if size == 0 {
            return Ok(data);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| invalid("truncated chunk".to_owned()))?;
        data.push_str(chunk);
        body = rest.get(size + 2..).unwrap_or("");
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::parse;

    #[test]
    fn plain_and_chunked_bodies() {
        let plain = parse("HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((plain.status, plain.body.as_str()), (409, "{}"));
        let chunked = parse(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((chunked.status, chunked.body.as_str()), (200, "abcde"));
    }
}
