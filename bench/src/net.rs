//! TCP throughput and latency between two kiln processes: `serve` on one host, `measure` on the
//! other. Each data connection starts with one byte saying what it is for: `T` (throughput: the
//! client streams until it half-closes, the server answers with the byte count it received) or
//! `L` (latency: the server echoes 64-byte messages until the client closes).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::stats::{percentile_sorted, summarize, Summary};

const MESSAGE: usize = 64;

/// Serves clients until no connection arrives for `idle` (a server never outlives its use).
pub fn serve(listener: TcpListener, idle: Duration) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut last = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                last = Instant::now();
                stream.set_nonblocking(false)?;
                std::thread::spawn(move || {
                    let _ = handle(stream);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if last.elapsed() > idle {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

fn handle(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut kind = [0u8; 1];
    stream.read_exact(&mut kind)?;
    match kind[0] {
        b'T' => {
            let mut buf = vec![0u8; 1 << 20];
            let mut total: u64 = 0;
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            stream.write_all(&total.to_le_bytes())
        }
        b'L' => {
            let mut msg = [0u8; MESSAGE];
            loop {
                if stream.read_exact(&mut msg).is_err() {
                    return Ok(());
                }
                stream.write_all(&msg)?;
            }
        }
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub streams: usize,
    pub seconds_per_repetition: f64,
    pub repetitions: usize,
    pub latency_messages: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub server: String,
    /// Gb/s (10^9 bits per second) counted by the server, per repetition.
    pub throughput_gbps: Vec<f64>,
    pub throughput: Summary,
    /// Round trips of a 64-byte message, microseconds.
    pub rtt_us: Summary,
    pub rtt_p99_us: f64,
}

/// One throughput measurement: `streams` connections send for `seconds`; Gb/s as the server counted.
///
/// # Errors
/// The server cannot be reached, or a connection breaks.
pub fn throughput_once(addr: &std::net::SocketAddr, streams: usize, seconds: f64) -> std::io::Result<f64> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let counts: Vec<std::io::Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..streams)
            .map(|_| {
                s.spawn(move || -> std::io::Result<u64> {
                    let mut stream = TcpStream::connect_timeout(addr, Duration::from_secs(10))?;
                    stream.write_all(b"T")?;
                    let buf = vec![0x5au8; 1 << 20];
                    while Instant::now() < deadline {
                        stream.write_all(&buf)?;
                    }
                    stream.shutdown(Shutdown::Write)?;
                    let mut count = [0u8; 8];
                    stream.read_exact(&mut count)?;
                    Ok(u64::from_le_bytes(count))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("stream panicked"))))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut bytes = 0;
    for c in counts {
        bytes += c?;
    }
    Ok(bytes as f64 * 8.0 / elapsed / 1e9)
}

/// Round trips of a 64-byte message, microseconds: `messages` of them, after 100 untimed.
///
/// # Errors
/// The server cannot be reached, or the connection breaks.
pub fn round_trips(addr: &std::net::SocketAddr, messages: usize) -> std::io::Result<Vec<f64>> {
    let mut stream = TcpStream::connect_timeout(addr, Duration::from_secs(10))?;
    stream.set_nodelay(true)?;
    stream.write_all(b"L")?;
    let mut msg = [0x42u8; MESSAGE];
    let mut rtt = Vec::with_capacity(messages);
    for i in 0..messages + 100 {
        let t0 = Instant::now();
        stream.write_all(&msg)?;
        stream.read_exact(&mut msg)?;
        if i >= 100 {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(rtt)
}

/// Measures throughput (`repetitions` rounds of `streams` parallel streams) and round-trip latency.
///
/// # Errors
/// The server cannot be reached, or a connection breaks.
pub fn measure(server: &str, config: &Config, mut progress: impl FnMut(&str)) -> std::io::Result<Report> {
    let addr = server
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{server}: no address")))?;
    let mut gbps = Vec::new();
    for r in 0..config.repetitions {
        progress(&format!("throughput {}/{} ({} streams)", r + 1, config.repetitions, config.streams));
        gbps.push(throughput_once(&addr, config.streams, config.seconds_per_repetition)?);
    }
    progress("latency");
    let rtt = round_trips(&addr, config.latency_messages)?;
    let mut sorted = rtt.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = percentile_sorted(&sorted, 0.99);
    Ok(Report {
        server: addr.to_string(),
        throughput: summarize(&gbps).expect("at least one repetition"),
        throughput_gbps: gbps,
        rtt_us: summarize(&rtt).expect("messages"),
        rtt_p99_us: p99,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || serve(listener, Duration::from_secs(5)));
        let config = Config { streams: 2, seconds_per_repetition: 0.05, repetitions: 2, latency_messages: 200 };
        let r = measure(&addr, &config, |_| {}).unwrap();
        assert_eq!(r.throughput_gbps.len(), 2);
        assert!(r.throughput.median > 0.0);
        assert!(r.rtt_us.median > 0.0 && r.rtt_p99_us >= r.rtt_us.min);
    }

    #[test]
    fn unreachable_server_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let config = Config { streams: 1, seconds_per_repetition: 0.01, repetitions: 1, latency_messages: 1 };
        assert!(measure(&addr, &config, |_| {}).is_err());
    }
}
