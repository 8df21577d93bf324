//! A GPU source read in a thread of its own, each read bounded in time.
//!
//! NVML calls go into the kernel driver, which can block for seconds (a GPU
//! falling off the bus, a driver busy with a reset). The reader is
//! slurmstepd or carma-monitor, holding the node's state lock: a read that
//! does not answer within `timeouts.gpu_read` fails instead, and while the
//! stuck call is still running later reads fail at once, naming it.

use super::{GpuSource, SourceError};
use crate::gpu::GpuReading;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

type Answer = Result<Vec<GpuReading>, SourceError>;

pub struct Bounded {
    ask: Sender<()>,
    answers: Receiver<Answer>,
    timeout: Duration,
    name: &'static str,
    /// When the read still unanswered was asked for.
    stuck_since: Option<Instant>,
}

fn panicked(what: &str) -> SourceError {
    SourceError(format!("{what} panicked (a bug: please report it)"))
}

impl Bounded {
    /// Opens a source with `open` in a new thread (opening loads and
    /// initialises the driver's library: bounded too) and reads it there.
    pub fn spawn<F>(name: &'static str, timeout: Duration, open: F) -> Result<Bounded, SourceError>
    where
        F: FnOnce() -> Result<Box<dyn GpuSource>, SourceError> + Send + 'static,
    {
        let (ask, asked) = mpsc::channel::<()>();
        let (answer, answers) = mpsc::channel::<Answer>();
        std::thread::Builder::new()
            .name(format!("carma-{name}"))
            .spawn(move || {
                let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(open))
                    .unwrap_or_else(|_| Err(panicked("opening the GPU source")));
                let mut source = match opened {
                    Ok(s) => {
                        if answer.send(Ok(Vec::new())).is_err() {
                            return;
                        }
                        s
                    }
                    Err(e) => {
                        let _ = answer.send(Err(e));
                        return;
                    }
                };
                while asked.recv().is_ok() {
                    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.read()))
                        .unwrap_or_else(|_| Err(panicked("reading the GPUs")));
                    if answer.send(got).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| SourceError(format!("cannot start the {name} reader thread: {e}")))?;
        match answers.recv_timeout(timeout) {
            Ok(Ok(_)) => Ok(Bounded { ask, answers, timeout, name, stuck_since: None }),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Err(SourceError(format!(
                "{name} did not initialise within {} ms (timeouts.gpu_read); is the GPU driver hung?",
                timeout.as_millis()
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(panicked("opening the GPU source")),
        }
    }
}

impl GpuSource for Bounded {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        if let Some(since) = self.stuck_since {
            // The late answer of the stuck read is stale: dropped.
            match self.answers.try_recv() {
                Ok(_) => self.stuck_since = None,
                Err(mpsc::TryRecvError::Empty) => {
                    return Err(SourceError(format!(
                        "{} has not answered a read for {} ms; is the GPU driver hung?",
                        self.name,
                        since.elapsed().as_millis()
                    )));
                }
                Err(mpsc::TryRecvError::Disconnected) => return Err(panicked("reading the GPUs")),
            }
        }
        let asked = Instant::now();
        self.ask.send(()).map_err(|_| panicked("reading the GPUs"))?;
        match self.answers.recv_timeout(self.timeout) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                self.stuck_since = Some(asked);
                Err(SourceError(format!(
                    "{} did not answer within {} ms (timeouts.gpu_read); is the GPU driver hung?",
                    self.name,
                    self.timeout.as_millis()
                )))
            }
            Err(RecvTimeoutError::Disconnected) => Err(panicked("reading the GPUs")),
        }
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers after `delay` each time (the first read blocks longest).
    struct Slow(Vec<Duration>);

    impl GpuSource for Slow {
        fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
            let d = if self.0.is_empty() { Duration::ZERO } else { self.0.remove(0) };
            std::thread::sleep(d);
            Ok(Vec::new())
        }
        fn name(&self) -> &'static str {
            "slow"
        }
    }

    #[test]
    fn a_hung_read_fails_in_bounded_time_and_later_reads_recover() {
        let ms = Duration::from_millis;
        let mut b = Bounded::spawn("slow", ms(200), move || Ok(Box::new(Slow(vec![ms(700)])))).unwrap();
        let t = Instant::now();
        let e = b.read().unwrap_err().to_string();
        assert!(t.elapsed() < ms(500) && e.contains("did not answer within 200 ms"), "{e}");
        // While the call is stuck, reads fail at once.
        let t = Instant::now();
        let e = b.read().unwrap_err().to_string();
        assert!(t.elapsed() < ms(50) && e.contains("has not answered"), "{e}");
        std::thread::sleep(ms(700));
        assert_eq!(b.read().unwrap(), Vec::new());
    }

    #[test]
    fn open_failures_hangs_and_panics_are_errors() {
        let ms = Duration::from_millis;
        // Generous bounds where the answer comes at once: a loaded machine
        // may take longer than 200 ms to start a thread.
        let e = Bounded::spawn("x", ms(5000), || Err(SourceError("no driver".into()))).err().unwrap();
        assert_eq!(e.0, "no driver");
        let e = Bounded::spawn("x", ms(100), move || {
            std::thread::sleep(ms(500));
            Err(SourceError("late".into()))
        })
        .err()
        .unwrap();
        assert!(e.0.contains("did not initialise within 100 ms"), "{e}");
        let e = Bounded::spawn("x", ms(5000), || panic!("boom")).err().unwrap();
        assert!(e.0.contains("panicked"), "{e}");
    }
}
