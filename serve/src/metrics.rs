//! `GET /metrics`: the server's own request counters and latencies, and gauges of the fleet
//! (hosts per configuration and verdict, the age of each host's last run, open regressions), in
//! the OpenMetrics text format through the `prometheus-client` crate.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use kiln_db::{AnyStore, ImportStats, Queries};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{pool::Pool, ApiError, App};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigVerdict {
    config: String,
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: String,
    hostname: String,
    config: String,
}

type Latency = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// How long the open-regressions count is kept: finding them reads every series of 30 days.
const REGRESSIONS_TTL: Duration = Duration::from_secs(300);

/// The server's metrics and the registry they are encoded from.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Latency,
    records: Counter,
    uploads: Counter,
    hosts: Family<ConfigVerdict, Gauge>,
    last_run_age: Family<HostLabels, Gauge<f64, AtomicU64>>,
    open_regressions: Gauge,
    /// When the regressions were last counted.
    regressions_at: Mutex<Option<Instant>>,
}

fn latency_histogram() -> Histogram {
    // 1 ms … 32 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kiln");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: Latency = Family::new_with_constructor(latency_histogram);
        let (records, uploads) = (Counter::default(), Counter::default());
        let hosts = Family::<ConfigVerdict, Gauge>::default();
        let last_run_age = Family::<HostLabels, Gauge<f64, AtomicU64>>::default();
        let open_regressions = Gauge::default();
        registry.register("http_requests", "HTTP requests answered, by route and status", requests.clone());
        registry.register("http_request_duration_seconds", "Time to answer a request, by route", latency.clone());
        registry.register("uploaded_records", "Export records received in successful uploads", records.clone());
        registry.register("uploads", "Successful uploads", uploads.clone());
        registry.register("fleet_hosts", "Hosts per configuration and newest verdict", hosts.clone());
        registry.register(
            "fleet_host_last_run_age_seconds",
            "Seconds since each host's newest benchmark run started",
            last_run_age.clone(),
        );
        registry.register(
            "fleet_open_regressions",
            "Regressions found in the last 30 days (recounted at most every 5 minutes)",
            open_regressions.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            records,
            uploads,
            hosts,
            last_run_age,
            open_regressions,
            regressions_at: Mutex::new(None),
        }
    }

    fn request(&self, method: String, route: String, status: u16, took: Duration) {
        self.latency.get_or_create(&RouteLabels { route: route.clone() }).observe(took.as_secs_f64());
        self.requests.get_or_create(&RequestLabels { method, route, status }).inc();
    }

    /// An upload was stored.
    pub fn uploaded(&self, stats: &ImportStats) {
        self.uploads.inc();
        self.records.inc_by(stats.records);
    }

    /// Reads the fleet gauges from the store and encodes everything.
    pub async fn scrape(&self, pool: &Pool) -> Result<String, ApiError> {
        let recount =
            self.regressions_at.lock().map(|t| t.is_none_or(|t| t.elapsed() > REGRESSIONS_TTL)).unwrap_or(true);
        let fleet = pool
            .read(async move |s: &mut AnyStore| -> anyhow::Result<_> {
                let hosts = s.hosts().await?;
                let verdicts = s.latest_verdicts().await?;
                let last_runs = s.last_runs().await?;
                let regressions = if recount {
                    let view = kiln_app::views::regressions_view(
                        s,
                        kiln_app::defaults::WINDOW,
                        None,
                        kiln_app::defaults::NOISE,
                    )
                    .await?;
                    Some(view.regressions.len() as i64)
                } else {
                    None
                };
                Ok((hosts, verdicts, last_runs, regressions))
            })
            .await??;
        let (hosts, verdicts, last_runs, regressions) = fleet;
        self.hosts.clear();
        self.last_run_age.clear();
        let now = kiln_text::timefmt::now_unix();
        for host in &hosts {
            let verdict = verdicts.get(&host.id).map(|v| v.verdict.clone()).unwrap_or_else(|| "none".into());
            self.hosts.get_or_create(&ConfigVerdict { config: host.config_name.clone(), verdict }).inc();
            if let Some(at) = last_runs.get(&host.id).and_then(|t| kiln_db::parse_rfc3339(t)) {
                let labels = HostLabels {
                    host: host.id.clone(),
                    hostname: host.hostname.clone().unwrap_or_default(),
                    config: host.config_name.clone(),
                };
                self.last_run_age.get_or_create(&labels).set((now - at).max(0) as f64);
            }
        }
        if let Some(n) = regressions {
            self.open_regressions.set(n);
            if let Ok(mut at) = self.regressions_at.lock() {
                *at = Some(Instant::now());
            }
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .map_err(|e| ApiError::Internal(format!("encoding the metrics: {e}")))?;
        Ok(text)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Counts and times every routed request.
pub async fn track(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "other".into());
    let method = req.method().to_string();
    let start = Instant::now();
    let response = next.run(req).await;
    app.metrics.request(method, route, response.status().as_u16(), start.elapsed());
    response
}
