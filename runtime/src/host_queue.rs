//! Interpret mode's stand-in for a stream: a thread that runs queued jobs one
//! after another, in the order they were queued, while the caller goes on.
//!
//! Like a CUDA stream, a failed job poisons the queue: the jobs after it are
//! skipped, and [`HostQueue::drain`] (the caller waiting for the queue, as the
//! launch stream waits for an event) reports the first error.

use crate::error::{Error, Result};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Progress {
    queued: u64,
    done: u64,
    error: Option<Error>,
}

/// Jobs run in order on a thread of their own (see the module docs).
pub(crate) struct HostQueue {
    name: String,
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    state: Arc<(Mutex<Progress>, Condvar)>,
}

impl HostQueue {
    /// A queue whose thread is called `name` (in errors and debuggers).
    pub(crate) fn new(name: &str) -> Result<HostQueue> {
        let (tx, rx) = channel::<Job>();
        let state: Arc<(Mutex<Progress>, Condvar)> = Arc::default();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in rx {
                    let failed = lock(&st.0).error.is_some();
                    // A failed queue skips the rest, as a failed stream does.
                    let outcome = if failed { Ok(()) } else { job() };
                    let mut p = lock(&st.0);
                    if let Err(e) = outcome {
                        p.error.get_or_insert(e);
                    }
                    p.done += 1;
                    st.1.notify_all();
                }
            })
            .map_err(|e| Error::Distributed {
                context: format!("starting the host queue `{name}`"),
                message: e.to_string(),
            })?;
        Ok(HostQueue {
            name: name.into(),
            tx: Some(tx),
            thread: Some(thread),
            state,
        })
    }

    /// Queues `job` after the jobs queued so far.
    pub(crate) fn push(&self, job: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        let gone = || Error::Distributed {
            context: format!("the host queue `{}`", self.name),
            message: "its thread has ended".into(),
        };
        lock(&self.state.0).queued += 1;
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(Box::new(job))
            .map_err(|_| gone())
    }

    /// Waits until every job queued so far has run, then reports (and clears)
    /// the first error among them. Each job bounds its own waits, so this ends.
    pub(crate) fn drain(&self) -> Result<()> {
        let (m, cv) = &*self.state;
        let mut p = lock(m);
        while p.done < p.queued {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return Err(Error::Distributed {
                    context: format!("the host queue `{}`", self.name),
                    message: "its thread ended with jobs left (a job panicked)".into(),
                });
            }
            p = cv
                .wait_timeout(p, std::time::Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match p.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for HostQueue {
    fn drop(&mut self) {
        // Closing the channel ends the thread after the jobs queued; a job's
        // waits are bounded, so joining cannot hang for long.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn jobs_run_in_order_and_drain_waits_for_them() {
        let q = HostQueue::new("test").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..50 {
            let s = seen.clone();
            q.push(move || {
                std::thread::sleep(std::time::Duration::from_micros(100));
                s.lock().unwrap().push(i);
                Ok(())
            })
            .unwrap();
        }
        q.drain().unwrap();
        assert_eq!(*seen.lock().unwrap(), (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_job_skips_the_rest_and_drain_reports_it_once() {
        let q = HostQueue::new("test").unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        q.push(|| {
            Err(Error::Distributed {
                context: "job 1".into(),
                message: "failed".into(),
            })
        })
        .unwrap();
        q.push(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        let e = q.drain().unwrap_err().to_string();
        assert!(e.contains("job 1"), "{e}");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        q.drain().unwrap();
    }
}
