//! Step logs: the engine's log lines (`Engine::set_log_sender`) forwarded to
//! `POST /api/v1/internal/runs/{id}/logs`.
//!
//! Lines are grouped by run, step and stream, in order, and sent in batches of at most
//! [`MAX_LINES_PER_CALL`] (the API's limit). During an invocation a pump pushes lines as they
//! come ([`LogForwarder::pump`]), as the reference worker's log pusher does: a step's lines
//! reach the API while its run goes on, and a run's last lines are mostly out by the time it
//! ends, not left for the end of the invocation, where the next invocation would wait for
//! them. At the end of the invocation, after every execution has stopped, a last flush sends
//! everything left, a handed-back run's partial output included. Nothing is sent after the
//! handler returns.
//!
//! **Routing.** The engine has one log channel for the whole process, and several invocations
//! may run in it at once (Lambda Managed Instances). Each invocation has an inbox
//! ([`LogForwarder::inbox`]) and routes its runs there as it claims them
//! ([`LogRoutes::route`]), before they execute. Whichever pump holds the engine's channel routes
//! every line that comes to the inbox of its run's invocation (holding it only while it waits:
//! it lets go before it pushes, for another pump to take over), and each invocation pushes only
//! what reaches its inbox. A line of a run no invocation routes (a stuck execution printing after
//! its invocation returned) is dropped: its run belongs to nobody here any more. The last flush
//! sends a marker through the engine's channel and forwards until the marker reaches the inbox:
//! the channel keeps its order, so every line the invocation's runs printed before they stopped
//! has been routed by then.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;

use ironflow_engine::log_sender::{LogLine, LogReceiver, LogSender};
use ironflow_store::entities::LogStream;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use uuid::Uuid;

use super::{ApiClient, CALL_TIMEOUT};
use crate::report::FlushReport;

/// The API takes at most 1000 lines per call.
pub const MAX_LINES_PER_CALL: usize = 1000;
/// Runs whose lines one flush pushes at once: 8 (each run's calls stay in order).
pub const PARALLEL_PUSHES: usize = 8;

/// Owns the engine's log receiver, routes its lines to the invocations' inboxes and pushes
/// each inbox's lines to the API.
pub struct LogForwarder {
    client: ApiClient,
    /// The engine's channel: held by one pump at a time, which routes what comes.
    receiver: Mutex<LogReceiver>,
    /// Into the engine's channel: the end-of-invocation markers.
    sender: LogSender,
    /// Run (or marker) id → the inbox of the invocation that owns it.
    routes: std::sync::Mutex<HashMap<Uuid, UnboundedSender<LogLine>>>,
}

/// Where one invocation routes its runs' lines (see the module docs); dropping it routes them
/// nowhere again.
pub struct LogRoutes {
    forwarder: Arc<LogForwarder>,
    inbox: UnboundedSender<LogLine>,
    marker: Uuid,
}

/// One invocation's inbox: the lines of the runs it routes, and its end-of-flush marker.
pub struct LogInbox {
    lines: UnboundedReceiver<LogLine>,
    marker: Uuid,
}

/// How a forwarding loop ends.
enum Until<'a> {
    /// When the token is cancelled (the pump).
    Stopped(&'a CancellationToken),
    /// When the inbox's marker comes through (the last flush).
    Marker,
}

#[derive(Serialize)]
struct PushLogs<'a> {
    step_id: Uuid,
    step_name: &'a str,
    stream: LogStream,
    lines: &'a [String],
}

impl LogForwarder {
    /// A forwarder for the engine's log channel (`sender` is a clone of the engine's).
    pub fn new(client: ApiClient, sender: LogSender, receiver: LogReceiver) -> Self {
        Self {
            client,
            receiver: Mutex::new(receiver),
            sender,
            routes: std::sync::Mutex::default(),
        }
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, UnboundedSender<LogLine>>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new invocation's routes and inbox.
    pub fn inbox(self: &Arc<Self>) -> (LogRoutes, LogInbox) {
        let (tx, rx) = unbounded_channel();
        let marker = Uuid::new_v4();
        self.routes().insert(marker, tx.clone());
        let routes = LogRoutes {
            forwarder: self.clone(),
            inbox: tx,
            marker,
        };
        (routes, LogInbox { lines: rx, marker })
    }

    /// Hand `line` to the inbox of its run's invocation, or drop it.
    fn route(&self, line: LogLine) {
        let run = line.run_id;
        let sent = match self.routes().get(&run) {
            Some(inbox) => inbox.send(line).is_ok(),
            None => false,
        };
        if !sent {
            debug!(run_id = %run, "step log line of a run no invocation here owns: dropped");
        }
    }

    /// Push the inbox's lines as they come until `stop` is cancelled, routing the engine's
    /// channel meanwhile, then return what was sent: wait for a line, take it and every line
    /// queued behind it, push them (each call bounded by `until`), and wait again. Lines
    /// printed during a push go out with the next one, so a chatty step makes at most one push
    /// at a time. Pushes run one after the other, so each run's lines keep their order.
    pub async fn pump(
        &self,
        inbox: &mut LogInbox,
        stop: CancellationToken,
        until: Instant,
    ) -> FlushReport {
        self.forward(inbox, Until::Stopped(&stop), until).await
    }

    /// Send every line the inbox's runs printed so far, bounded by `until` (after its pump has
    /// stopped): the marker goes through the engine's channel, and the lines before it are
    /// forwarded.
    pub async fn flush(&self, inbox: &mut LogInbox, until: Instant) -> FlushReport {
        let marker = LogLine {
            run_id: inbox.marker,
            step_id: Uuid::nil(),
            step_name: Arc::from(""),
            stream: LogStream::System,
            line: String::new(),
            at: chrono::Utc::now(),
        };
        if self.sender.send(marker).is_err() {
            warn!("step logs not flushed: the engine's log channel is closed");
            return FlushReport::default();
        }
        self.forward(inbox, Until::Marker, until).await
    }

    /// The forwarding loop of [`LogForwarder::pump`] and [`LogForwarder::flush`].
    async fn forward(&self, inbox: &mut LogInbox, end: Until<'_>, until: Instant) -> FlushReport {
        let mut total = FlushReport::default();
        loop {
            let Some(first) = self.next_own_line(inbox, &end, until).await else {
                if matches!(end, Until::Marker) && Instant::now() >= until {
                    warn!("step logs not all flushed: the invocation deadline came first");
                }
                return total;
            };
            let mut lines = Vec::new();
            let mut marked = false;
            let queued = std::iter::from_fn(|| inbox.lines.try_recv().ok());
            for line in std::iter::once(first).chain(queued) {
                if line.run_id == inbox.marker {
                    marked = true;
                } else {
                    lines.push(line);
                }
            }
            total += self.push_all(lines, until).await;
            if marked && matches!(end, Until::Marker) {
                return total;
            }
        }
    }

    /// The next line of the inbox; meanwhile route the engine's channel, if no other pump does.
    /// `None` when the loop ends first (stopped, or `until`).
    async fn next_own_line(
        &self,
        inbox: &mut LogInbox,
        end: &Until<'_>,
        until: Instant,
    ) -> Option<LogLine> {
        let stopped = async {
            match end {
                Until::Stopped(stop) => stop.cancelled().await,
                Until::Marker => std::future::pending().await,
            }
        };
        tokio::pin!(stopped);
        tokio::select! {
            biased;
            () = &mut stopped => None,
            () = sleep_until(until) => None,
            line = inbox.lines.recv() => line,
            mut channel = self.receiver.lock() => loop {
                // This pump routes until a line of its own comes; the guard goes before it
                // pushes.
                tokio::select! {
                    biased;
                    () = &mut stopped => return None,
                    () = sleep_until(until) => return None,
                    line = inbox.lines.recv() => return line,
                    line = channel.recv() => {
                        // None: the channel is closed, which the forwarder's own sender
                        // prevents.
                        let line = line?;
                        self.route(line);
                        while let Ok(line) = channel.try_recv() {
                            self.route(line);
                        }
                    }
                }
            },
        }
    }

    /// Push `lines`: runs concurrently, each run's batches in order.
    async fn push_all(&self, lines: Vec<LogLine>, until: Instant) -> FlushReport {
        futures_util::stream::iter(in_order_by_run(group(lines)))
            .map(|batches| self.push_in_order(batches, until))
            .buffer_unordered(PARALLEL_PUSHES)
            .fold(FlushReport::default(), |mut total, report| async move {
                total += report;
                total
            })
            .await
    }

    /// Push `batches` (of one run) one after the other, each bounded by `until`.
    async fn push_in_order(&self, batches: Vec<Batch>, until: Instant) -> FlushReport {
        let mut report = FlushReport::default();
        for batch in batches {
            let n = batch.lines.len();
            match timeout_at(until, self.push(&batch)).await {
                Ok(Ok(())) => report.sent += n,
                Ok(Err(e)) => {
                    warn!(run_id = %batch.run_id, error = %e, lines = n, "could not push step logs");
                    report.dropped += n;
                    report.failed_calls += 1;
                }
                Err(_) => {
                    warn!(run_id = %batch.run_id, lines = n, "step logs dropped: the invocation deadline came first");
                    report.dropped += n;
                    report.failed_calls += 1;
                }
            }
        }
        report
    }

    async fn push(&self, batch: &Batch) -> Result<(), String> {
        let url = self
            .client
            .internal(&format!("/runs/{}/logs", batch.run_id));
        let body = PushLogs {
            step_id: batch.step_id,
            step_name: &batch.step_name,
            stream: batch.stream,
            lines: &batch.lines,
        };
        let resp = self
            .client
            .request(reqwest::Method::POST, &url)
            .timeout(CALL_TIMEOUT)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            Err(format!("POST {url}: HTTP {status}: {text}"))
        }
    }
}

impl LogRoutes {
    /// Route the lines of `run` (claimed by this invocation, not started yet) to its inbox.
    pub fn route(&self, run: Uuid) {
        self.forwarder.routes().insert(run, self.inbox.clone());
    }
}

impl Drop for LogRoutes {
    fn drop(&mut self) {
        let mut routes = self.forwarder.routes();
        routes.retain(|_, inbox| !inbox.same_channel(&self.inbox));
        routes.remove(&self.marker);
    }
}

/// The batches of [`group`], split by run (first-seen order), each run's batches in their
/// order: a run's lines reach the API in the order they were printed, across its steps too.
fn in_order_by_run(batches: Vec<Batch>) -> Vec<Vec<Batch>> {
    let mut order: Vec<Uuid> = Vec::new();
    let mut runs: HashMap<Uuid, Vec<Batch>> = HashMap::new();
    for batch in batches {
        runs.entry(batch.run_id)
            .or_insert_with(|| {
                order.push(batch.run_id);
                Vec::new()
            })
            .push(batch);
    }
    order.iter().filter_map(|id| runs.remove(id)).collect()
}

/// Lines of one run, step and stream, in the order they were printed.
#[derive(Debug)]
struct Batch {
    run_id: Uuid,
    step_id: Uuid,
    step_name: String,
    stream: LogStream,
    lines: Vec<String>,
}

/// Group `lines` by run, step and stream (first-seen order), in batches of at most
/// [`MAX_LINES_PER_CALL`].
fn group(lines: Vec<LogLine>) -> Vec<Batch> {
    let mut order: Vec<(Uuid, Uuid, LogStream)> = Vec::new();
    let mut groups: HashMap<(Uuid, Uuid, LogStream), Batch> = HashMap::new();
    for line in lines {
        let key = (line.run_id, line.step_id, line.stream);
        let batch = groups.entry(key).or_insert_with(|| {
            order.push(key);
            Batch {
                run_id: line.run_id,
                step_id: line.step_id,
                step_name: line.step_name.to_string(),
                stream: line.stream,
                lines: Vec::new(),
            }
        });
        batch.lines.push(line.line);
    }
    let mut out = Vec::new();
    for key in order {
        let Some(batch) = groups.remove(&key) else {
            continue;
        };
        let mut lines = batch.lines.into_iter().peekable();
        while lines.peek().is_some() {
            out.push(Batch {
                run_id: batch.run_id,
                step_id: batch.step_id,
                step_name: batch.step_name.clone(),
                stream: batch.stream,
                lines: lines.by_ref().take(MAX_LINES_PER_CALL).collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn line(run: Uuid, step: Uuid, stream: LogStream, text: &str) -> LogLine {
        LogLine {
            run_id: run,
            step_id: step,
            step_name: Arc::from("s"),
            stream,
            line: text.to_string(),
            at: chrono::Utc::now(),
        }
    }

    #[test]
    fn groups_by_run_step_and_stream_in_order_and_splits_at_the_api_limit() {
        let (r, s) = (Uuid::new_v4(), Uuid::new_v4());
        let mut lines: Vec<LogLine> = (0..1500)
            .map(|i| line(r, s, LogStream::Stdout, &i.to_string()))
            .collect();
        lines.insert(10, line(r, s, LogStream::Stderr, "err"));
        let batches = group(lines);
        assert_eq!(batches.len(), 3);
        assert_eq!(batches[0].lines.len(), 1000);
        assert_eq!(batches[0].lines[0], "0");
        assert_eq!(batches[1].lines.len(), 500);
        assert_eq!(batches[1].lines[0], "1000");
        assert_eq!(batches[2].stream, LogStream::Stderr);

        let other = Uuid::new_v4();
        let mut with_other = vec![line(other, s, LogStream::Stdout, "x")];
        with_other.extend((0..1500).map(|i| line(r, s, LogStream::Stdout, &i.to_string())));
        with_other.push(line(r, s, LogStream::Stderr, "err"));
        let runs = in_order_by_run(group(with_other));
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0][0].run_id, other);
        assert_eq!(runs[1].len(), 3);
        assert_eq!(runs[1][0].lines[0], "0");
        assert_eq!(runs[1][1].lines[0], "1000");
        assert_eq!(runs[1][2].stream, LogStream::Stderr);
    }
}
