//! The fleet's series: every host's metric values packed one blob per host and 30-day period
//! (`host_series`), grouped by comparable configuration (`series_keys`), and the codec of those blobs.
//!
//! Why blobs: reading a row through sqlx costs microseconds, so two million metric rows cost
//! seconds; two thousand host blobs cost milliseconds. The blobs are derived data, written in the
//! same transaction as the runs they come from and rebuilt from the normalized tables when absent.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::Direction;

/// A series blob that cannot be read (then the series are rebuilt from the tables).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    #[error("not a kiln series blob")]
    NotSeries,
    #[error("truncated series blob")]
    Truncated,
    #[error("a series point names run {0}, which the blob does not hold")]
    NoSuchRun(u32),
}

/// One comparable group and metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesKey {
    pub id: i64,
    pub config_fingerprint: String,
    pub config_name: String,
    pub benchmark: String,
    pub bench_config: String,
    pub software_fingerprint: String,
    pub metric: String,
    pub unit: String,
    pub direction: Direction,
}

/// A run as the fleet sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    pub run_id: uuid::Uuid,
    /// Start, seconds since the Unix epoch.
    pub t: i64,
    /// Mean total GPU power during the run, when telemetry had it.
    pub power_watts: Option<f32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub key: i64,
    /// (index into the host's runs, value), in time order.
    pub points: Vec<(u32, f64)>,
}

/// One host's runs and series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostSeries {
    pub runs: Vec<RunPoint>,
    pub series: Vec<Series>,
}

const MAGIC: &[u8; 4] = b"KSB1";

impl HostSeries {
    /// `KSB1`, runs (u32 count; uuid 16 bytes, t i64, power f32 or NaN), series (u32 count; key i64,
    /// u32 count, then (run u32, value f64) each). Little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let points: usize = self.series.iter().map(|s| s.points.len()).sum();
        let mut out = Vec::with_capacity(12 + self.runs.len() * 28 + self.series.len() * 12 + points * 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in &self.runs {
            out.extend_from_slice(r.run_id.as_bytes());
            out.extend_from_slice(&r.t.to_le_bytes());
            out.extend_from_slice(&r.power_watts.unwrap_or(f32::NAN).to_le_bytes());
        }
        out.extend_from_slice(&(self.series.len() as u32).to_le_bytes());
        for s in &self.series {
            out.extend_from_slice(&s.key.to_le_bytes());
            out.extend_from_slice(&(s.points.len() as u32).to_le_bytes());
            for (run, value) in &s.points {
                out.extend_from_slice(&run.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> std::result::Result<HostSeries, BlobError> {
        struct Reader<'a>(&'a [u8]);
        impl Reader<'_> {
            fn take<const N: usize>(&mut self) -> std::result::Result<[u8; N], BlobError> {
                if self.0.len() < N {
                    return Err(BlobError::Truncated);
                }
                let (head, rest) = self.0.split_at(N);
                self.0 = rest;
                Ok(head.try_into().expect("N bytes"))
            }
            fn u32(&mut self) -> std::result::Result<u32, BlobError> {
                Ok(u32::from_le_bytes(self.take()?))
            }
        }
        let mut r = Reader(bytes);
        if &r.take::<4>()? != MAGIC {
            return Err(BlobError::NotSeries);
        }
        let n = r.u32()? as usize;
        let mut runs = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let id = uuid::Uuid::from_bytes(r.take()?);
            let t = i64::from_le_bytes(r.take()?);
            let p = f32::from_le_bytes(r.take()?);
            runs.push(RunPoint { run_id: id, t, power_watts: (!p.is_nan()).then_some(p) });
        }
        let n = r.u32()? as usize;
        let mut series = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let key = i64::from_le_bytes(r.take()?);
            let m = r.u32()? as usize;
            let mut points = Vec::with_capacity(m.min(1 << 24));
            for _ in 0..m {
                let run = r.u32()?;
                if run as usize >= runs.len() {
                    return Err(BlobError::NoSuchRun(run));
                }
                points.push((run, f64::from_le_bytes(r.take()?)));
            }
            series.push(Series { key, points });
        }
        Ok(HostSeries { runs, series })
    }

    /// Adds runs and their points, keeping runs and points in time order; a run already present is
    /// skipped.
    pub(crate) fn merge(&mut self, new: Vec<(RunPoint, Vec<(i64, f64)>)>) {
        let known: HashSet<uuid::Uuid> = self.runs.iter().map(|r| r.run_id).collect();
        // Expand to (run, key, value), re-sort runs by time, renumber.
        let mut all: Vec<(RunPoint, Vec<(i64, f64)>)> = Vec::with_capacity(self.runs.len() + new.len());
        let mut per_run: Vec<Vec<(i64, f64)>> = vec![Vec::new(); self.runs.len()];
        for s in &self.series {
            for &(run, value) in &s.points {
                per_run[run as usize].push((s.key, value));
            }
        }
        all.extend(self.runs.drain(..).zip(per_run));
        all.extend(new.into_iter().filter(|(r, _)| !known.contains(&r.run_id)));
        all.sort_by_key(|(r, _)| (r.t, r.run_id));
        let mut by_key: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
        for (i, (run, values)) in all.into_iter().enumerate() {
            for (key, value) in values {
                by_key.entry(key).or_default().push((i as u32, value));
            }
            self.runs.push(run);
        }
        self.series = by_key.into_iter().map(|(key, points)| Series { key, points }).collect();
    }

    pub fn points(&self) -> usize {
        self.series.iter().map(|s| s.points.len()).sum()
    }
}

/// The length of a series partition: a window loads only the partitions it reaches.
pub const PERIOD_SECONDS: i64 = 30 * 86_400;

pub(crate) fn period_of(t: i64) -> i64 {
    t.div_euclid(PERIOD_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trip_and_merge_in_time_order() {
        let id = |n: u8| uuid::Uuid::from_bytes([n; 16]);
        let mut s = HostSeries::default();
        s.merge(vec![(RunPoint { run_id: id(2), t: 200, power_watts: Some(700.0) }, vec![(1, 2.0), (2, 20.0)])]);
        s.merge(vec![
            (RunPoint { run_id: id(1), t: 100, power_watts: None }, vec![(1, 1.0)]),
            (RunPoint { run_id: id(2), t: 200, power_watts: None }, vec![(1, 99.0)]), // already there
        ]);
        assert_eq!(s.runs.iter().map(|r| r.t).collect::<Vec<_>>(), [100, 200]);
        assert_eq!(
            s.series,
            vec![Series { key: 1, points: vec![(0, 1.0), (1, 2.0)] }, Series { key: 2, points: vec![(1, 20.0)] }]
        );
        let back = HostSeries::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        assert!(HostSeries::decode(&s.encode()[..20]).is_err());
    }
}
