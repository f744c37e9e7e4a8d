//! A link with a round trip, between a client and the embedded API, for the benchmark: a TCP
//! proxy on loopback that holds every chunk of bytes for half the round trip in each direction.
//! This is fault injection (network delay), not a stand-in for anything: the peers on both sides
//! are the real client and the real API. Where the kernel has `netem` (`tc qdisc ... netem`), a
//! network namespace with a veth pair would do the same; the machines this project runs on do
//! not have it.
//!
//! Each direction of each connection is an OS thread pair (a reader stamping each chunk with its
//! due time, a writer sleeping until then): `std::thread::sleep` holds to tens of microseconds,
//! where tokio's timer would round every hold up to the next millisecond. [`DelayProxy::measure`]
//! says what round trip the proxy adds.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A delay proxy in front of `upstream`; stops, closing every connection through it, when
/// dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Every socket the proxy opened or accepted, to close them when it stops.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl DelayProxy {
    /// Listen on a free loopback port and forward to `upstream`, adding `rtt` to every round
    /// trip (`rtt / 2` each way).
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn start(upstream: SocketAddr, rtt: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let one_way = rtt / 2;
        {
            let (stop, sockets) = (stop.clone(), sockets.clone());
            thread::Builder::new()
                .name("delay-proxy".into())
                .spawn(move || {
                    for client in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        if let Ok(client) = client {
                            relay(client, upstream, one_way, &sockets);
                        }
                    }
                })?;
        }
        Ok(Self {
            addr,
            upstream,
            stop,
            sockets,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<the proxy's address>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The round trip the proxy adds, measured: the median time to the first byte of an HTTP
    /// answer over `samples` requests through it, minus the same made directly.
    ///
    /// # Errors
    ///
    /// When a connection cannot be made.
    pub fn measure(&self, samples: usize) -> std::io::Result<Duration> {
        let mut through = Vec::with_capacity(samples);
        let mut direct = Vec::with_capacity(samples);
        for _ in 0..samples.max(1) {
            through.push(first_reply(self.addr)?);
            direct.push(first_reply(self.upstream)?);
        }
        through.sort();
        direct.sort();
        let median = |v: &[Duration]| v[v.len() / 2];
        Ok(median(&through).saturating_sub(median(&direct)))
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop, which then sees the stop.
        let _ = TcpStream::connect(self.addr);
        for socket in self
            .sockets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// How long an HTTP request to `addr` takes to get its first byte back (on a connection
/// already open, so that only the request's round trip is timed).
fn first_reply(addr: SocketAddr) -> std::io::Result<Duration> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let started = Instant::now();
    stream
        .write_all(b"GET /api/v1/health-check HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)?;
    Ok(started.elapsed())
}

fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    one_way: Duration,
    sockets: &Mutex<Vec<TcpStream>>,
) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let clones = [
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    ];
    let [Ok(client_w), Ok(server_w), Ok(client_keep), Ok(server_keep)] = clones else {
        return;
    };
    sockets
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([client_keep, server_keep]);
    pipe(client, server_w, one_way);
    pipe(server, client_w, one_way);
}

/// Copy `from` to `to`, each chunk written `delay` after it was read; order and throughput are
/// kept (a chunk read while another waits is not delayed twice).
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0
                    || chunks
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                {
                    break;
                }
            }
        });
    let _ = thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            while let Ok((at, chunk)) = due.recv() {
                let wait = at.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    thread::sleep(wait);
                }
                if to.write_all(&chunk).is_err() {
                    return;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}
