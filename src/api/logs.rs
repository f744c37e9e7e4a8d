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

use std::collections::HashMap;

use futures_util::StreamExt;

use ironflow_engine::log_sender::{LogLine, LogReceiver};
use ironflow_store::entities::LogStream;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use super::{ApiClient, CALL_TIMEOUT};
use crate::report::FlushReport;

/// The API takes at most 1000 lines per call.
pub const MAX_LINES_PER_CALL: usize = 1000;
/// Runs whose lines one flush pushes at once: 8 (each run's calls stay in order).
pub const PARALLEL_PUSHES: usize = 8;

/// Owns the engine's log receiver and pushes its lines to the API.
pub struct LogForwarder {
    client: ApiClient,
    receiver: Mutex<LogReceiver>,
}

#[derive(Serialize)]
struct PushLogs<'a> {
    step_id: Uuid,
    step_name: &'a str,
    stream: LogStream,
    lines: &'a [String],
}

impl LogForwarder {
    /// A forwarder for the receiving end of the engine's log channel.
    pub fn new(client: ApiClient, receiver: LogReceiver) -> Self {
        Self {
            client,
            receiver: Mutex::new(receiver),
        }
    }

    /// Push lines as they come until `stop` is cancelled, then return what was sent: wait for
    /// a line, take it and every line queued behind it, push them (each call bounded by
    /// `until`), and wait again. Lines printed during a push go out with the next one, so a
    /// chatty step makes at most one push at a time. Pushes run one after the other, so each
    /// run's lines keep their order. The pump holds the receiver while it waits: the worker
    /// runs one invocation at a time, whose last [`LogForwarder::flush`] comes after its pump
    /// has stopped.
    pub async fn pump(&self, stop: CancellationToken, until: Instant) -> FlushReport {
        let mut total = FlushReport::default();
        loop {
            let lines = {
                let mut receiver = tokio::select! {
                    () = stop.cancelled() => return total,
                    receiver = self.receiver.lock() => receiver,
                };
                let first = tokio::select! {
                    () = stop.cancelled() => return total,
                    line = receiver.recv() => line,
                };
                // None: the engine is gone, nothing more will come.
                let Some(first) = first else { return total };
                let mut lines = vec![first];
                while let Ok(line) = receiver.try_recv() {
                    lines.push(line);
                }
                lines
            };
            total += self.push_all(lines, until).await;
        }
    }

    /// Send every line queued so far, bounded by `until`.
    pub async fn flush(&self, until: Instant) -> FlushReport {
        let lines = {
            // Free once this invocation's pump has stopped; bounded all the same.
            let Ok(mut receiver) = timeout_at(until, self.receiver.lock()).await else {
                warn!("step logs not flushed: the log channel stayed busy until the deadline");
                return FlushReport::default();
            };
            let mut lines = Vec::new();
            while let Ok(line) = receiver.try_recv() {
                lines.push(line);
            }
            lines
        };
        self.push_all(lines, until).await
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
