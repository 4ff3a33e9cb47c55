//! The step trace (`OXCCL_TRACE=path`): per rank, each call's host time
//! (from the hand-off to the backend to its return) and, where the
//! backend records them (the host backend), every plan step's start and
//! end, the peer it waited on and whether it had to; for the first
//! `OXCCL_TRACE_CALLS` calls of each rank. Written as Chrome trace JSON
//! (Perfetto, `chrome://tracing`): a process per rank, named `rank N`,
//! with a `host` thread for calls and one thread per channel for steps.
//! The file is written once every rank of this process has recorded its
//! calls, else when the communicators are dropped. Ranks as processes
//! each write `path.rankN`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use oxccl_core::trace::{Stamp, StepRecord};
use oxccl_core::DataType;
use parking_lot::Mutex;

use crate::config::TraceSettings;

/// One recorded call.
pub(crate) struct CallTrace {
    pub name: &'static str,
    pub dtype: DataType,
    pub start: Instant,
    pub end: Instant,
    /// Steps of the rank's plan, for readers to compare with the step
    /// events.
    pub plan_steps: usize,
    pub steps: Vec<StepRecord>,
    /// Steps the device is still stamping (read when the trace is
    /// written).
    pub later: Vec<crate::backend::LaterSteps>,
}

impl std::fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTrace")
            .field("name", &self.name)
            .field("steps", &self.steps.len())
            .field("later", &self.later.len())
            .finish()
    }
}

/// A clique's trace in the making.
#[derive(Debug)]
pub(crate) struct Tracer {
    path: PathBuf,
    limit: usize,
    epoch: Instant,
    /// Per rank of the clique, its calls so far (only this process's ranks
    /// record).
    ranks: Vec<Mutex<Vec<CallTrace>>>,
    local: Vec<u32>,
    written: AtomicBool,
}

impl Tracer {
    /// The trace of a clique of `nranks`, of which `local` run here
    /// (`proc_rank`: the one rank of this process, when ranks are
    /// processes).
    pub(crate) fn new(s: &TraceSettings, nranks: u32, proc_rank: Option<u32>) -> Tracer {
        let (path, local) = match proc_rank {
            Some(r) => {
                let mut p = s.path.clone().into_os_string();
                p.push(format!(".rank{r}"));
                (PathBuf::from(p), vec![r])
            }
            None => (s.path.clone(), (0..nranks).collect()),
        };
        Tracer {
            path,
            limit: s.calls,
            epoch: Instant::now(),
            ranks: (0..nranks).map(|_| Mutex::new(Vec::new())).collect(),
            local,
            written: AtomicBool::new(false),
        }
    }

    /// Whether `rank`'s next call is to be recorded.
    pub(crate) fn wants(&self, rank: u32) -> bool {
        self.ranks
            .get(rank as usize)
            .is_some_and(|r| r.lock().len() < self.limit)
    }

    /// Adds `rank`'s call; writes the file once every local rank has its
    /// calls.
    pub(crate) fn record(&self, rank: u32, call: CallTrace) {
        let Some(r) = self.ranks.get(rank as usize) else {
            return;
        };
        let full = {
            let mut r = r.lock();
            if r.len() < self.limit {
                r.push(call);
            }
            r.len() >= self.limit
        };
        if full
            && self
                .local
                .iter()
                .all(|&l| self.ranks[l as usize].lock().len() >= self.limit)
        {
            self.write();
        }
    }

    /// Writes the trace (once); a failure is a warning.
    fn write(&self) {
        if self.written.swap(true, Ordering::AcqRel) {
            return;
        }
        let json = self.json();
        match std::fs::write(&self.path, json) {
            Ok(()) => {
                tracing::info!(target: "oxccl::profile", "oxccl: step trace written to {}", self.path.display())
            }
            Err(e) => tracing::warn!(
                "oxccl: could not write the step trace {}: {e}",
                self.path.display()
            ),
        }
    }

    /// Microseconds since the trace began.
    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_nanos() as f64 / 1e3
    }

    /// The Chrome trace JSON of everything recorded (device stamps read
    /// first).
    pub(crate) fn json(&self) -> String {
        let mut ev: Vec<String> = Vec::new();
        for &rank in &self.local {
            let mut calls = self.ranks[rank as usize].lock();
            for call in calls.iter_mut() {
                for later in std::mem::take(&mut call.later) {
                    call.steps.extend(later());
                }
            }
            ev.push(meta("process_name", rank, 0, &format!("rank {rank}")));
            ev.push(meta("thread_name", rank, 0, "host"));
            let mut channels: Vec<u32> = calls
                .iter()
                .flat_map(|c| c.steps.iter().map(|s| s.channel))
                .collect();
            channels.sort_unstable();
            channels.dedup();
            for c in channels {
                ev.push(meta("thread_name", rank, c + 1, &format!("channel {c}")));
            }
            for (i, call) in calls.iter().enumerate() {
                ev.push(format!(
                    r#"{{"ph":"X","cat":"call","name":"{}","pid":{rank},"tid":0,"ts":{:.3},"dur":{:.3},"args":{{"call":{i},"dtype":"{}","plan_steps":{},"steps":{}}}}}"#,
                    call.name,
                    self.us(call.start),
                    self.us(call.end) - self.us(call.start),
                    call.dtype.name(),
                    call.plan_steps,
                    call.steps.len(),
                ));
                // Device stamps: placed from the call's host start on, in
                // their own clock's order.
                let dev0 = call
                    .steps
                    .iter()
                    .filter_map(|s| match s.start {
                        Stamp::Device(ns) => Some(ns),
                        Stamp::Host(_) => None,
                    })
                    .min()
                    .unwrap_or(0);
                let at = |t: Stamp| match t {
                    Stamp::Host(t) => self.us(t),
                    Stamp::Device(ns) => self.us(call.start) + ns.saturating_sub(dev0) as f64 / 1e3,
                };
                for s in &call.steps {
                    let clock = match s.start {
                        Stamp::Host(_) => "host",
                        Stamp::Device(_) => "globaltimer",
                    };
                    let mut e = format!(
                        r#"{{"ph":"X","cat":"step","name":"{}","pid":{rank},"tid":{},"ts":{:.3},"dur":{:.3},"args":{{"call":{i},"channel":{},"step":{},"waited":{},"clock":"{clock}""#,
                        s.name,
                        s.channel + 1,
                        at(s.start),
                        at(s.end) - at(s.start),
                        s.channel,
                        s.step,
                        s.waited,
                    );
                    if let Stamp::Device(ns) = s.start {
                        let _ = write!(e, r#","globaltimer_ns":{ns}"#);
                    }
                    if let Some(p) = s.peer {
                        let _ = write!(e, r#","peer":{p}"#);
                    }
                    e.push_str("}}");
                    ev.push(e);
                }
            }
        }
        format!(
            "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{}\n]}}\n",
            ev.join(",\n")
        )
    }

    /// Where the trace goes.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// A metadata event naming a process or thread.
fn meta(what: &str, pid: u32, tid: u32, name: &str) -> String {
    format!(r#"{{"ph":"M","name":"{what}","pid":{pid},"tid":{tid},"args":{{"name":"{name}"}}}}"#)
}

impl Tracer {
    /// Writes what was recorded, if anything and not yet written: when the
    /// communicators go, before their backend (whose memory holds device
    /// stamps).
    pub(crate) fn finish(&self) {
        if self
            .local
            .iter()
            .any(|&l| !self.ranks[l as usize].lock().is_empty())
        {
            self.write();
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ranks_write_files_of_their_own() {
        let s = TraceSettings {
            path: "/tmp/t.json".into(),
            calls: 2,
        };
        let p = |t: Tracer| t.path().to_path_buf();
        assert_eq!(
            p(Tracer::new(&s, 4, Some(3))),
            PathBuf::from("/tmp/t.json.rank3")
        );
        assert_eq!(p(Tracer::new(&s, 4, None)), PathBuf::from("/tmp/t.json"));
    }

    #[test]
    fn only_the_first_calls_are_kept() {
        let s = TraceSettings {
            path: std::env::temp_dir()
                .join(format!("oxccl-trace-unit-{}.json", std::process::id())),
            calls: 1,
        };
        let t = Tracer::new(&s, 2, None);
        assert!(t.wants(0));
        let now = Instant::now();
        let call = || CallTrace {
            name: "allreduce",
            dtype: DataType::F32,
            start: now,
            end: now,
            plan_steps: 0,
            steps: vec![],
            later: vec![],
        };
        t.record(0, call());
        assert!(!t.wants(0) && t.wants(1));
        assert!(!t.written.load(Ordering::Acquire));
        t.record(1, call());
        assert!(
            t.written.load(Ordering::Acquire),
            "written once every rank is full"
        );
        let _ = std::fs::remove_file(&s.path);
    }

    /// Device stamps are placed from the call's host start, in their own
    /// clock's order and durations.
    #[test]
    fn device_steps_keep_their_globaltimer_order() {
        let s = TraceSettings {
            path: "/nonexistent/never-written.json".into(),
            calls: 4,
        };
        let t = Tracer::new(&s, 1, None);
        let start = t.epoch + std::time::Duration::from_micros(10);
        let step = |k: u32, a: u64, b: u64| StepRecord {
            channel: 0,
            step: k,
            name: "recv",
            peer: Some(0),
            waited: false,
            start: Stamp::Device(a),
            end: Stamp::Device(b),
        };
        let call = CallTrace {
            name: "allreduce",
            dtype: DataType::F32,
            start,
            end: start,
            plan_steps: 2,
            steps: vec![step(0, 5_000_000, 5_002_000)],
            later: vec![Box::new(move || vec![step(1, 5_003_000, 5_007_500)])],
        };
        t.ranks[0].lock().push(call);
        let j = t.json();
        t.written.store(true, Ordering::Release);
        assert!(j.contains(r#""ts":10.000,"dur":2.000"#), "{j}");
        assert!(j.contains(r#""ts":13.000,"dur":4.500"#), "{j}");
        assert!(
            j.contains(r#""clock":"globaltimer","globaltimer_ns":5003000"#),
            "{j}"
        );
    }
}
