//! The control plane of a `kiln cluster` job: what the ranks tell each other to run in step (an id
//! made by rank 0, whether each could set up, every rank's figures), never the measured traffic
//! (NCCL's, or kiln's TCP benchmark). Two carriers: MPI (`mpirun`, `srun`; the `mpi` feature) and,
//! for jobs `torchrun` started, kiln's own rendezvous over TCP: rank 0 listens where the launcher's
//! `MASTER_ADDR`/`MASTER_PORT` say, every other rank connects to it, and an all-gather is each rank
//! sending its bytes to rank 0 and rank 0 sending all of them back (a star: a few bytes per rank
//! per step, as torchrun's own store carries them).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_bench::cluster::Launch;

use super::Watchdog;

/// What the ranks of a job say to each other.
pub trait Control {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank's `mine`, in rank order, on every rank; `what` says in the watchdog what it waits
    /// for (rank 0 names the ranks it has not heard from where the carrier lets it).
    ///
    /// # Errors
    /// A rank is gone (its connection closed) or says something that is not kiln's.
    fn all_gather(&self, mine: &[u8], watchdog: &Watchdog, what: &str) -> Result<Vec<Vec<u8>>>;

    /// A barrier that knows who is missing: rank 0 names in its watchdog the ranks it has not
    /// heard from ("round 2/3: waiting for rank 2 (node7)"); `names` labels the ranks where known.
    ///
    /// # Errors
    /// As [`Control::all_gather`].
    fn roll_call(&self, watchdog: &Watchdog, what: &str, names: Option<&[String]>) -> Result<()>;
}

/// Rank 0's `mine` on every rank.
///
/// # Errors
/// As [`Control::all_gather`].
pub fn broadcast(c: &dyn Control, mine: &[u8], watchdog: &Watchdog, what: &str) -> Result<Vec<u8>> {
    let mine = if c.rank() == 0 { mine } else { &[] };
    Ok(c.all_gather(mine, watchdog, what)?.swap_remove(0))
}

/// Every rank's `mine`, in rank order (every rank gives as many values).
///
/// # Errors
/// As [`Control::all_gather`], or ranks that gave different counts.
pub fn gather_f64s(c: &dyn Control, mine: &[f64], watchdog: &Watchdog, what: &str) -> Result<Vec<Vec<f64>>> {
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = c.all_gather(&bytes, watchdog, what)?;
    let counts: Vec<usize> = all.iter().map(|b| b.len() / 8).collect();
    anyhow::ensure!(
        all.iter().all(|b| b.len() == bytes.len()),
        "the ranks gave {} values where each gives {}: kiln differs between nodes",
        counts.iter().map(usize::to_string).collect::<Vec<_>>().join(", "),
        mine.len()
    );
    Ok(all
        .iter()
        .map(|b| b.chunks_exact(8).map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes"))).collect())
        .collect())
}

/// Each of `mine`'s values reduced over the ranks by `pick` (every rank gives as many).
///
/// # Errors
/// As [`gather_f64s`].
pub fn reduce(
    c: &dyn Control,
    mine: &[f64],
    pick: fn(f64, f64) -> f64,
    watchdog: &Watchdog,
    what: &str,
) -> Result<Vec<f64>> {
    let all = gather_f64s(c, mine, watchdog, what)?;
    Ok((0..mine.len()).map(|i| all.iter().map(|v| v[i]).reduce(pick).unwrap_or(f64::NAN)).collect())
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How much of a failing rank's error [`agree_on`] hands to the others.
const REASON_BYTES: usize = 512;

/// Every rank says whether it could `what`; all stop if one could not, naming it with its reason
/// (the failing ranks' errors travel to every rank, so that whichever rank's message the launcher
/// shows before it stops the others says why: `mpirun` kills the rest when one rank exits with an
/// error).
///
/// # Errors
/// This rank or another could not, or the job's control plane failed.
pub fn agree_on<T>(c: &dyn Control, watchdog: &Watchdog, what: &str, mine: Result<T>) -> Result<T> {
    let reason = match &mine {
        Ok(_) => String::new(),
        // One line, cut at a character boundary; never empty, so that it marks a failure.
        Err(e) => format!("{e:#} ").replace('\n', " "),
    };
    let all = c.all_gather(
        cut(&reason, REASON_BYTES).as_bytes(),
        watchdog,
        &format!("hearing whether every rank could {what}"),
    )?;
    let bad: Vec<usize> = all.iter().enumerate().filter(|(_, r)| !r.is_empty()).map(|(r, _)| r).collect();
    if bad.is_empty() {
        return mine;
    }
    let said: Vec<String> =
        bad.iter().map(|&r| format!("rank {r}: {}", String::from_utf8_lossy(&all[r]).trim_end())).collect();
    let who: Vec<String> = bad.iter().map(usize::to_string).collect();
    Err(Agreed(format!(
        "rank{} {} could not {what} ({}); every rank stopped",
        if bad.len() > 1 { "s" } else { "" },
        who.join(", "),
        said.join("; ")
    ))
    .into())
}

/// An error every rank of the job has alike ([`agree_on`]): each can act on it in step (stop a
/// curve where it is and store what came before) without asking the others.
#[derive(Debug)]
pub struct Agreed(pub String);

impl std::fmt::Display for Agreed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Agreed {}

/// A cluster-run id made by rank 0 and shared.
///
/// # Errors
/// As [`Control::all_gather`].
pub fn cluster_id(c: &dyn Control, watchdog: &Watchdog) -> Result<String> {
    let id = broadcast(c, uuid::Uuid::new_v4().as_bytes(), watchdog, "hearing the cluster run's id from rank 0")?;
    Ok(uuid::Uuid::from_slice(&id).context("rank 0 sent a cluster run id that is not 16 bytes")?.to_string())
}

/// What a rank says first when it connects to rank 0: kiln's greeting, its rank and world size.
const HELLO: &[u8; 12] = b"kiln-rdzv-1\n";

/// The largest message a rank may send (a rank's figures are a few kilobytes).
const MAX_MESSAGE: usize = 16 << 20;

/// kiln's rendezvous over TCP, for jobs without MPI (`torchrun`).
pub struct Tcp {
    rank: usize,
    size: usize,
    /// Rank 0: a connection to every other rank, index r − 1; another rank: its one to rank 0.
    peers: Vec<TcpStream>,
}

impl Tcp {
    /// Where rank 0 listens: `KILN_RENDEZVOUS` (`HOST:PORT`) if set, else the launcher's
    /// `MASTER_ADDR` and `MASTER_PORT` — one port up where torchrun's own agent holds that one
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`: its store listens there for the job's lifetime).
    ///
    /// # Errors
    /// No address to meet at, or one that does not resolve.
    pub fn address(get: impl Fn(&str) -> Option<String>) -> Result<(String, SocketAddr)> {
        let text = match get("KILN_RENDEZVOUS").filter(|v| !v.is_empty()) {
            Some(given) => given,
            None => {
                let host = get("MASTER_ADDR").filter(|v| !v.is_empty()).context(
                    "launched by torchrun without MASTER_ADDR: kiln's rendezvous needs rank 0's address \
                     (MASTER_ADDR and MASTER_PORT, or KILN_RENDEZVOUS=HOST:PORT)",
                )?;
                let port: u16 = get("MASTER_PORT")
                    .context("MASTER_PORT is not set: kiln's rendezvous needs rank 0's port (or KILN_RENDEZVOUS)")?
                    .trim()
                    .parse()
                    .context("MASTER_PORT is not a port number")?;
                let agent = get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
                let port = if agent {
                    port.checked_add(1).context("MASTER_PORT 65535 leaves no port above it")?
                } else {
                    port
                };
                if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            }
        };
        // IPv4 where the name has both, so that every rank (and rank 0's listener) picks alike.
        let all: Vec<SocketAddr> =
            text.to_socket_addrs().with_context(|| format!("kiln's rendezvous at {text}: not an address"))?.collect();
        let addr = all
            .iter()
            .find(|a| a.is_ipv4())
            .or(all.first())
            .copied()
            .with_context(|| format!("kiln's rendezvous at {text}: the name resolves to no address"))?;
        Ok((text, addr))
    }

    /// Joins the job: rank 0 listens and waits for every other rank (naming in its watchdog those
    /// that have not come), the others connect to it, retrying while it is not up yet.
    ///
    /// # Errors
    /// Rank 0 cannot listen there, a rank cannot reach it within the stall limit, or two
    /// processes claim one rank.
    pub fn join(launch: &Launch, watchdog: &Watchdog, stall: Duration) -> Result<Tcp> {
        let (text, addr) = Tcp::address(|k| std::env::var(k).ok())?;
        Tcp::join_at((&text, addr), (launch.rank, launch.world_size), watchdog, stall)
    }

    /// [`Tcp::join`] at a given address (`text` is how it was given, for messages).
    fn join_at(
        (text, addr): (&str, SocketAddr),
        (rank, size): (usize, usize),
        watchdog: &Watchdog,
        stall: Duration,
    ) -> Result<Tcp> {
        anyhow::ensure!(
            size >= 2,
            "one rank: `kiln cluster` runs as every rank of a job (`torchrun --nnodes 4 --nproc-per-node 1 …`)"
        );
        if rank == 0 {
            // Every address of the host, at the port: rank 0's MASTER_ADDR is its own.
            let any: SocketAddr =
                if addr.is_ipv4() { ([0, 0, 0, 0], addr.port()).into() } else { ([0u16; 8], addr.port()).into() };
            let listener = TcpListener::bind(any).with_context(|| {
                format!("rank 0: listening for kiln's rendezvous on port {} ({text}); set KILN_RENDEZVOUS=HOST:PORT to a free port", addr.port())
            })?;
            Tcp::gather_peers(&listener, size, watchdog)
        } else {
            watchdog.at(format!("connecting to rank 0 at {text}"));
            let started = Instant::now();
            let mut stream = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                    Ok(s) => break s,
                    Err(e) if started.elapsed() < stall => {
                        tracing::debug!("rendezvous at {text}: {e}; trying again");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("rank {rank}: rank 0 cannot be reached at {text} for kiln's rendezvous")
                        })
                    }
                }
            };
            stream.set_nodelay(true).ok();
            let mut hello = HELLO.to_vec();
            hello.extend((rank as u32).to_le_bytes());
            hello.extend((size as u32).to_le_bytes());
            stream.write_all(&hello).with_context(|| format!("rank {rank}: greeting rank 0 at {text}"))?;
            watchdog.behind("waiting for rank 0 to hear from every rank");
            let answer = read_frame(&mut stream).with_context(|| format!("rank {rank}: rank 0 at {text}"))?;
            if !answer.is_empty() {
                anyhow::bail!("rank 0 refused this rank: {}", String::from_utf8_lossy(&answer));
            }
            Ok(Tcp { rank, size, peers: vec![stream] })
        }
    }

    /// Rank 0: accepts a connection from each other rank (what is not kiln's is dropped), then
    /// answers every one (an empty frame: go on).
    fn gather_peers(listener: &TcpListener, size: usize, watchdog: &Watchdog) -> Result<Tcp> {
        let mut peers: Vec<Option<TcpStream>> = (1..size).map(|_| None).collect();
        while peers.iter().any(Option::is_none) {
            let missing: Vec<String> =
                (1..size).filter(|r| peers[r - 1].is_none()).take(8).map(|r| format!("rank {r}")).collect();
            watchdog.at(format!("waiting for {} to join kiln's rendezvous", missing.join(", ")));
            let (mut stream, from) = listener.accept().context("rank 0: accepting the ranks' connections")?;
            stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
            let mut hello = [0u8; 20];
            if stream.read_exact(&mut hello).is_err() || &hello[..12] != HELLO {
                tracing::warn!("rendezvous: {from} is not a kiln rank; dropped");
                continue;
            }
            stream.set_read_timeout(None).ok();
            stream.set_nodelay(true).ok();
            let their_rank = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
            let their_size = u32::from_le_bytes(hello[16..20].try_into().expect("4 bytes")) as usize;
            let refusal = if their_size != size {
                Some(format!("rank {their_rank} ({from}) says the world has {their_size} ranks, rank 0 {size}"))
            } else if their_rank == 0 || their_rank >= size {
                Some(format!("{from} says it is rank {their_rank} of {size}"))
            } else if peers[their_rank - 1].is_some() {
                Some(format!("two processes say they are rank {their_rank} (the second from {from})"))
            } else {
                None
            };
            if let Some(why) = refusal {
                let _ = write_frame(&mut stream, why.as_bytes());
                anyhow::bail!("kiln's rendezvous: {why}: each rank must be started once, with one WORLD_SIZE");
            }
            peers[their_rank - 1] = Some(stream);
        }
        let mut peers: Vec<TcpStream> = peers.into_iter().map(|p| p.expect("every rank joined")).collect();
        for (i, p) in peers.iter_mut().enumerate() {
            write_frame(p, &[]).with_context(|| format!("rank 0: answering rank {}", i + 1))?;
        }
        Ok(Tcp { rank: 0, size, peers })
    }
}

impl Control for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, mine: &[u8], watchdog: &Watchdog, what: &str) -> Result<Vec<Vec<u8>>> {
        self.gather_naming(mine, watchdog, what, None)
    }

    fn roll_call(&self, watchdog: &Watchdog, what: &str, names: Option<&[String]>) -> Result<()> {
        self.gather_naming(&[], watchdog, what, names).map(drop)
    }
}

impl Tcp {
    /// [`Control::all_gather`], rank 0 naming the rank it waits for with its label where known.
    fn gather_naming(
        &self,
        mine: &[u8],
        watchdog: &Watchdog,
        what: &str,
        names: Option<&[String]>,
    ) -> Result<Vec<Vec<u8>>> {
        if self.rank != 0 {
            let mut to_0 = &self.peers[0];
            write_frame(&mut to_0, mine).with_context(|| format!("rank {}: sending to rank 0 ({what})", self.rank))?;
            watchdog.at_least(format!("{what}: waiting for rank 0 to hear from every rank"), 2);
            let all = read_frame(&mut to_0).with_context(|| format!("rank {}: rank 0 ({what})", self.rank))?;
            return split(&all, self.size);
        }
        let mut all = vec![mine.to_vec()];
        for (i, mut p) in self.peers.iter().enumerate() {
            let label = names.and_then(|n| n.get(i + 1)).map_or(String::new(), |l| format!(" ({l})"));
            watchdog.at_least(format!("{what}: waiting for rank {}{label}", i + 1), 1);
            all.push(read_frame(&mut p).with_context(|| format!("rank 0: rank {} ({what})", i + 1))?);
        }
        let mut joined = Vec::with_capacity(all.iter().map(|a| a.len() + 4).sum());
        for a in &all {
            joined.extend((a.len() as u32).to_le_bytes());
            joined.extend(a);
        }
        for (i, mut p) in self.peers.iter().enumerate() {
            write_frame(&mut p, &joined).with_context(|| format!("rank 0: sending to rank {} ({what})", i + 1))?;
        }
        Ok(all)
    }
}

/// Whether this job's ranks meet through kiln's rendezvous rather than MPI: `torchrun` starts
/// processes that MPI cannot join, and `KILN_RENDEZVOUS` asks for it under any launcher.
pub fn wanted(launch: &Option<Launch>) -> bool {
    launch.as_ref().is_some_and(|l| l.launcher == kiln_bench::cluster::Launcher::Torchrun)
        || std::env::var_os("KILN_RENDEZVOUS").is_some_and(|v| !v.is_empty())
}

/// One length-prefixed message.
fn write_frame(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(bytes.len() + 4);
    frame.extend((bytes.len() as u32).to_le_bytes());
    frame.extend(bytes);
    w.write_all(&frame)
}

/// One length-prefixed message; a closed connection says that the rank on the other end is gone.
fn read_frame(r: &mut impl Read) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => anyhow::anyhow!("its connection closed: that rank stopped"),
        _ => anyhow::Error::new(e),
    })?;
    let len = u32::from_le_bytes(len) as usize;
    anyhow::ensure!(len <= MAX_MESSAGE, "a message of {len} bytes: not kiln's");
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes).context("the connection closed inside a message: that rank stopped")?;
    Ok(bytes)
}

/// Rank 0's joined messages, one per rank.
fn split(mut all: &[u8], size: usize) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(size);
    while all.len() >= 4 {
        let len = u32::from_le_bytes(all[..4].try_into().expect("4 bytes")) as usize;
        anyhow::ensure!(all.len() >= 4 + len, "rank 0 sent a cut message");
        out.push(all[4..4 + len].to_vec());
        all = &all[4 + len..];
    }
    anyhow::ensure!(out.len() == size, "rank 0 sent {} ranks' messages where the world has {size}", out.len());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn rank_0_is_met_at_the_launchers_address_or_one_port_above_torchruns_own_store() {
        let plain = env(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
        assert_eq!(Tcp::address(plain).unwrap().1, "127.0.0.1:29500".parse().unwrap());
        let agent =
            env(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("TORCHELASTIC_USE_AGENT_STORE", "True")]);
        assert_eq!(Tcp::address(agent).unwrap().1, "127.0.0.1:29501".parse().unwrap());
        let given =
            env(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("KILN_RENDEZVOUS", "127.0.0.1:4000")]);
        assert_eq!(Tcp::address(given).unwrap().1, "127.0.0.1:4000".parse().unwrap());
        let none = Tcp::address(env(&[("MASTER_PORT", "29500")])).unwrap_err().to_string();
        assert!(none.contains("MASTER_ADDR"), "{none}");
        let bad = Tcp::address(env(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "port")])).unwrap_err().to_string();
        assert!(bad.contains("MASTER_PORT is not a port number"), "{bad}");
    }

    /// A watchdog that never fires within a test.
    fn quiet() -> Watchdog {
        Watchdog::with_action(Duration::from_secs(600), |_, _| {})
    }

    /// `size` ranks joined at a free port, each in its own thread running `f`; their answers by rank.
    fn job<T: Send + 'static>(size: usize, f: fn(Tcp) -> T) -> Vec<Result<T>> {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let threads: Vec<_> = (0..size)
            .map(|rank| {
                std::thread::spawn(move || {
                    let tcp = Tcp::join_at(("test", addr), (rank, size), &quiet(), Duration::from_secs(20))?;
                    Ok(f(tcp))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gathers_every_ranks_bytes_and_hears_who_could_not_and_why() {
        let answers = job(3, |tcp| {
            let dog = quiet();
            let mine = vec![tcp.rank() as u8; tcp.rank()];
            let all = tcp.all_gather(&mine, &dog, "test").unwrap();
            let id = cluster_id(&tcp, &dog).unwrap();
            let max = reduce(&tcp, &[tcp.rank() as f64, -(tcp.rank() as f64)], f64::max, &dog, "test").unwrap();
            let fine = agree_on(&tcp, &dog, "count", Ok(tcp.rank())).unwrap();
            let mine = if tcp.rank() == 2 { Err(anyhow::anyhow!("no GPU\nhere")) } else { Ok(()) };
            let refused = agree_on(&tcp, &dog, "find a GPU", mine).unwrap_err().to_string();
            (all, id, max, fine, refused)
        });
        let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
        for (rank, (all, id, max, fine, refused)) in answers.iter().enumerate() {
            assert_eq!(all, &vec![vec![], vec![1], vec![2, 2]], "rank {rank}");
            assert_eq!(id, &answers[0].1, "one cluster id");
            assert_eq!(max, &vec![2.0, 0.0]);
            assert_eq!(*fine, rank);
            assert_eq!(refused, "rank 2 could not find a GPU (rank 2: no GPU here); every rank stopped", "rank {rank}");
        }
    }

    #[test]
    fn a_stranger_on_the_port_is_dropped_and_two_processes_of_one_rank_are_refused() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let zero = std::thread::spawn(move || Tcp::join_at(("t", addr), (0, 3), &quiet(), Duration::from_secs(20)));
        // A stranger's bytes first: dropped, rank 0 keeps waiting.
        let stranger = loop {
            if let Ok(mut s) = TcpStream::connect(addr) {
                s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let ones: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(move || Tcp::join_at(("t", addr), (1, 3), &quiet(), Duration::from_secs(20))))
            .collect();
        let zero = zero.join().unwrap().err().expect("rank 0 refuses a second rank 1").to_string();
        assert!(zero.contains("two processes say they are rank 1"), "{zero}");
        drop(stranger);
        let refused = ones.into_iter().filter_map(|t| t.join().unwrap().err()).count();
        assert_eq!(refused, 2, "neither rank 1 goes on");
    }

    #[test]
    fn messages_split_back_into_every_ranks_and_a_cut_one_is_refused() {
        let mut joined = Vec::new();
        for m in [&b"abc"[..], b"", b"xy"] {
            joined.extend((m.len() as u32).to_le_bytes());
            joined.extend(m);
        }
        assert_eq!(split(&joined, 3).unwrap(), vec![b"abc".to_vec(), vec![], b"xy".to_vec()]);
        assert!(split(&joined, 4).is_err());
        assert!(split(&joined[..joined.len() - 1], 3).is_err());
    }
}
