//! Who is where: every rank tells rank 0, twice a second over UDP, what its watchdog last said and
//! for how long, from a thread of its own. When the job stops moving, rank 0's watchdog says what
//! each rank last said — so that a rank that froze inside a collective (stopped, its node hung,
//! cut off) is named as the one that went silent, and one that is somewhere else than the others
//! (still computing, stuck on its disk) as the one that is elsewhere, where every rank inside the
//! collective only knows that the collective does not end. The beats carry a token rank 0 made for
//! the job; anything else on the port is ignored.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::rendezvous::{broadcast, Control};
use super::Watchdog;

/// How often a rank beats.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// Beats missed before a rank counts as silent.
const SILENT_AFTER: u32 = 4;

/// What rank 0 last heard from each rank.
#[derive(Default)]
pub struct Roster {
    /// Per rank: when the last beat came, what the rank said it was doing, and for how long then.
    heard: Mutex<Vec<Option<(Instant, String, f64)>>>,
}

impl Roster {
    fn new(size: usize) -> Roster {
        Roster { heard: Mutex::new(vec![None; size]) }
    }

    fn hear(&self, rank: usize, position: String, for_s: f64) {
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = heard.get_mut(rank) {
            *slot = Some((Instant::now(), position, for_s));
        }
    }

    /// What the other ranks last said, silent ones first: "rank 2 silent for 9.1 s (…; it last
    /// said: X); ranks 1, 3 at 'Y' for 8 s". `None` when no rank but rank 0 is in the job.
    pub fn describe(&self) -> Option<String> {
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        if heard.len() < 2 {
            return None;
        }
        let now = Instant::now();
        let silent_after = INTERVAL * SILENT_AFTER;
        let mut silent = Vec::new();
        // Ranks grouped by what they said, in rank order of the group's first.
        let mut groups: Vec<(String, Vec<usize>, f64)> = Vec::new();
        for (rank, h) in heard.iter().enumerate().skip(1) {
            match h {
                None => silent.push(format!("rank {rank} never heard from")),
                Some((at, position, _)) if now.duration_since(*at) > silent_after => silent.push(format!(
                    "rank {rank} silent for {:.1} s (stopped, frozen or cut off; it last said: {position})",
                    now.duration_since(*at).as_secs_f64()
                )),
                Some((at, position, for_s)) => {
                    let for_s = for_s + now.duration_since(*at).as_secs_f64();
                    match groups.iter_mut().find(|g| g.0 == *position) {
                        Some(g) => {
                            g.1.push(rank);
                            g.2 = g.2.min(for_s);
                        }
                        None => groups.push((position.clone(), vec![rank], for_s)),
                    }
                }
            }
        }
        let said = groups.into_iter().map(|(position, ranks, for_s)| {
            let who: Vec<String> = ranks.iter().map(usize::to_string).collect();
            let s = if ranks.len() > 1 { "s" } else { "" };
            format!("rank{s} {} at '{position}' for {for_s:.0} s", who.join(", "))
        });
        Some(silent.into_iter().chain(said).collect::<Vec<_>>().join("; "))
    }
}

/// The job's heartbeats, set up over its control plane: rank 0 listens (a UDP port on every
/// address) and its watchdog will tell what it heard; every other rank beats to rank 0 — at
/// loopback where both run on one host, else at the address of rank 0's default route.
///
/// # Errors
/// The control plane failed. (A rank that cannot beat says so on stderr and goes on: heartbeats
/// only explain a stall, they never make one.)
pub fn start(c: &dyn Control, watchdog: &Watchdog) -> Result<()> {
    let rank = c.rank();
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    let listening = if rank == 0 {
        match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
            Ok(socket) => Some(socket),
            Err(e) => {
                eprintln!("kiln: rank 0: no heartbeats (a UDP port: {e}); a stall will not say who went silent");
                None
            }
        }
    } else {
        None
    };
    let token = *uuid::Uuid::new_v4().as_bytes();
    // Rank 0's token, port, default-route address and host name.
    let mine = match &listening {
        Some(socket) => {
            let port = socket.local_addr().map(|a| a.port()).unwrap_or(0);
            let addr =
                super::rails(&[]).ok().and_then(|r| r.first().map(|r| r.address.to_string())).unwrap_or_default();
            let mut v = token.to_vec();
            v.extend(port.to_le_bytes());
            v.extend(format!("{addr}\n{host}").bytes());
            v
        }
        None => Vec::new(),
    };
    let zero = broadcast(c, &mine, watchdog, "hearing where rank 0 listens for heartbeats")?;
    if zero.len() < 18 {
        return Ok(()); // rank 0 could not listen: said there
    }
    let token: [u8; 16] = zero[..16].try_into().context("16 bytes")?;
    let port = u16::from_le_bytes([zero[16], zero[17]]);
    if let Some(socket) = listening {
        let roster = Arc::new(Roster::new(c.size()));
        watchdog.tell_with(Arc::clone(&roster));
        std::thread::spawn(move || listen(&socket, &token, &roster));
        return Ok(());
    }
    let text = String::from_utf8_lossy(&zero[18..]).into_owned();
    let (addr, zero_host) = text.split_once('\n').unwrap_or((&text, ""));
    let ip: IpAddr = if zero_host == host || addr.is_empty() {
        Ipv4Addr::LOCALHOST.into()
    } else {
        addr.parse().unwrap_or(Ipv4Addr::LOCALHOST.into())
    };
    watchdog.beat_to(SocketAddr::new(ip, port), rank, token);
    Ok(())
}

/// Rank 0's receiving thread: every beat with the job's token into the roster.
fn listen(socket: &UdpSocket, token: &[u8; 16], roster: &Roster) {
    let mut buf = [0u8; 1024];
    while let Ok((n, _)) = socket.recv_from(&mut buf) {
        if let Some((rank, for_s, position)) = decode(&buf[..n], token) {
            roster.hear(rank, position, for_s);
        }
    }
}

/// One beat: the token, the rank, milliseconds at the position, the position's words.
pub(super) fn encode(token: &[u8; 16], rank: usize, for_s: f64, position: &str) -> Vec<u8> {
    let mut v = token.to_vec();
    v.extend((rank as u32).to_le_bytes());
    v.extend(((for_s * 1000.0) as u64).to_le_bytes());
    v.extend(super::rendezvous::cut(position, 900).as_bytes());
    v
}

/// A beat of this job, or `None` (a stranger's datagram, another job's).
fn decode(beat: &[u8], token: &[u8; 16]) -> Option<(usize, f64, String)> {
    if beat.len() < 28 || &beat[..16] != token {
        return None;
    }
    let rank = u32::from_le_bytes(beat[16..20].try_into().ok()?) as usize;
    let ms = u64::from_le_bytes(beat[20..28].try_into().ok()?);
    Some((rank, ms as f64 / 1000.0, String::from_utf8_lossy(&beat[28..]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_reads_back_and_a_strangers_datagram_does_not() {
        let token = [7u8; 16];
        let beat = encode(&token, 3, 2.5, "all_reduce of 1024 B with every rank");
        assert_eq!(decode(&beat, &token), Some((3, 2.5, "all_reduce of 1024 B with every rank".to_string())));
        assert_eq!(decode(&beat, &[8u8; 16]), None, "another job's token");
        assert_eq!(decode(b"GET / HTTP/1.1", &token), None);
        // A long position is cut at a character boundary.
        let long = "é".repeat(600);
        let (_, _, cut) = decode(&encode(&token, 1, 0.0, &long), &token).unwrap();
        assert!(cut.len() <= 900 && cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_roster_names_the_silent_rank_first_and_groups_the_others_by_what_they_said() {
        let roster = Roster::new(5);
        roster.hear(1, "all_reduce of 1 MiB with every rank".into(), 7.0);
        roster.hear(3, "all_reduce of 1 MiB with every rank".into(), 6.0);
        roster.hear(4, "training on 4 ranks, step 3/20".into(), 9.0);
        // Rank 2 beat long ago (its entry aged by hand).
        roster.heard.lock().unwrap()[2] =
            Some((Instant::now() - INTERVAL * 10, "all_reduce of 1 MiB with every rank".into(), 0.5));
        let said = roster.describe().unwrap();
        assert!(said.starts_with("rank 2 silent for 5"), "{said}");
        assert!(said.contains("it last said: all_reduce of 1 MiB"), "{said}");
        assert!(said.contains("ranks 1, 3 at 'all_reduce of 1 MiB with every rank' for 6 s"), "{said}");
        assert!(said.contains("rank 4 at 'training on 4 ranks, step 3/20' for 9 s"), "{said}");
        let fresh = Roster::new(3);
        fresh.hear(1, "x".into(), 0.0);
        assert!(fresh.describe().unwrap().starts_with("rank 2 never heard from"));
    }
}
