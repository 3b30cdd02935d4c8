//! The server's connections to its store (SQLite or PostgreSQL): one writer and a few readers,
//! each on a thread of its own with a current-thread runtime. Requests hand them work and await
//! the answer, so that a long fleet question neither blocks the HTTP workers nor waits behind an
//! upload (SQLite's WAL lets readers and the writer run at once), and uploads are applied one at a
//! time, as SQLite allows anyway.

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use kiln_db::{Access, AnyStore, Location};

type Job = Box<dyn FnOnce(&mut AnyStore, &tokio::runtime::Runtime) + Send>;

/// The server's store connections.
pub struct Pool {
    writer: Mutex<Option<mpsc::Sender<Job>>>,
    readers: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A connection is gone (its thread stopped): the server is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("the database connection is closed (the server is stopping)")]
pub struct Closed;

/// Opens `path` on a new thread and serves jobs from `jobs` until every sender is dropped.
fn connection(
    location: &Location,
    access: Access,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    name: String,
) -> Result<JoinHandle<()>> {
    let (opened_tx, opened_rx) = mpsc::channel::<Result<()>>();
    let location = location.clone();
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = opened_tx.send(Err(e).context("starting a database thread's runtime"));
                    return;
                }
            };
            let mut store = match rt.block_on(AnyStore::open(&location, access)) {
                Ok(store) => store,
                Err(e) => {
                    let _ = opened_tx.send(Err(e.into()));
                    return;
                }
            };
            let _ = opened_tx.send(Ok(()));
            loop {
                // The lock is held only while waiting for the next job, not while running it.
                let job = match jobs.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => break,
                };
                let Ok(job) = job else { break };
                // A PostgreSQL server that restarted dropped the connection: connect again. (Still
                // down: the job fails with the reason and the request answers 503.)
                if let Err(e) = rt.block_on(store.revive()) {
                    tracing::warn!("{e}");
                }
                // A panic in one request must not take the connection down with it; the job's
                // answer channel is dropped, and the request answers 500.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut store, &rt)));
            }
            if let Err(e) = rt.block_on(store.close()) {
                tracing::warn!("closing the database: {e}");
            }
        })
        .context("starting a database thread")?;
    opened_rx.recv().context("a database thread stopped while opening")??;
    Ok(thread)
}

impl Pool {
    /// Opens the writer (creating and migrating the database where needed), then `readers`
    /// read-only connections.
    pub fn open(location: &Location, readers: usize) -> Result<Pool> {
        let (writer, writer_rx) = mpsc::channel::<Job>();
        let mut threads =
            vec![connection(location, Access::Write, Arc::new(Mutex::new(writer_rx)), "kiln-db-writer".into())?];
        let (reader_tx, reader_rx) = mpsc::channel::<Job>();
        let reader_rx = Arc::new(Mutex::new(reader_rx));
        for i in 0..readers.max(1) {
            threads.push(connection(location, Access::Read, reader_rx.clone(), format!("kiln-db-reader-{i}"))?);
        }
        Ok(Pool {
            writer: Mutex::new(Some(writer)),
            readers: Mutex::new(Some(reader_tx)),
            threads: Mutex::new(threads),
        })
    }

    async fn call<T, F>(queue: &Mutex<Option<mpsc::Sender<Job>>>, f: F) -> Result<T, Closed>
    where
        F: AsyncFnOnce(&mut AnyStore) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |store, rt| {
            let _ = tx.send(rt.block_on(f(store)));
        });
        let sender = queue.lock().map_err(|_| Closed)?.clone().ok_or(Closed)?;
        sender.send(job).map_err(|_| Closed)?;
        rx.await.map_err(|_| Closed)
    }

    /// Runs `f` on the writer connection.
    pub async fn write<T, F>(&self, f: F) -> Result<T, Closed>
    where
        F: AsyncFnOnce(&mut AnyStore) -> T + Send + 'static,
        T: Send + 'static,
    {
        Self::call(&self.writer, f).await
    }

    /// Runs `f` on a reader connection.
    pub async fn read<T, F>(&self, f: F) -> Result<T, Closed>
    where
        F: AsyncFnOnce(&mut AnyStore) -> T + Send + 'static,
        T: Send + 'static,
    {
        Self::call(&self.readers, f).await
    }

    /// Lets every connection finish its queue, then closes them (checkpointing the WAL).
    pub fn close(&self) {
        for queue in [&self.writer, &self.readers] {
            if let Ok(mut q) = queue.lock() {
                q.take();
            }
        }
        let threads = self.threads.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}
