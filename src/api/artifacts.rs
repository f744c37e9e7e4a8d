//! The artifact sink through the internal API: a step's declared outputs are uploaded to
//! `POST /api/v1/internal/runs/{run}/steps/{step}/artifacts/{name}` with their content type;
//! the worker never holds a storage credential.
//!
//! The API's refusals become clear step errors: 413 (over the API's size limit), 409 (the step
//! already has an artifact of that name), 501 (the API has no artifact storage configured).
//! Reading an artifact back for a later step's input uses `GET` on the same route; ironflow-api
//! 3.1 serves only `POST` there (405), which becomes an "artifacts unavailable" step error that
//! says so. An upload the API cuts off early (it answers 501 or 413 before reading the body)
//! is diagnosed with a body-less probe, so the step error still names the cause.

use bytes::Bytes;
use futures_util::TryStreamExt;
use ironflow_artifacts::blob_store::ByteStream;
use ironflow_artifacts::error::ArtifactError;
use ironflow_engine::artifact::{ArtifactFuture, ArtifactSink, ArtifactUpload};
use ironflow_engine::error::EngineError;
use ironflow_store::entities::Artifact;
use ironflow_store::error::StoreError;
use reqwest::{Body, Method, StatusCode};

use super::ApiClient;

/// [`ArtifactSink`] over the internal API.
#[derive(Debug, Clone)]
pub struct ApiArtifactSink {
    client: ApiClient,
}

#[derive(serde::Deserialize)]
struct Envelope<T> {
    data: T,
}

impl ApiArtifactSink {
    /// A sink using `client`.
    pub fn new(client: ApiClient) -> Self {
        Self { client }
    }

    fn url(&self, run: impl std::fmt::Display, step: impl std::fmt::Display, name: &str) -> String {
        self.client
            .internal(&format!("/runs/{run}/steps/{step}/artifacts/{name}"))
    }
}

impl ApiArtifactSink {
    /// An upload cut off while sending: the API may have answered early and closed the
    /// connection (501 without storage, 413 over its size limit) before reading the body.
    /// Ask it with a body-less upload under a name it always refuses (`-probe`): 501 means no
    /// storage; anything else leaves the transport error, with the size limit as a hint.
    async fn diagnose_cut_upload(&self, upload: &ArtifactUpload, e: reqwest::Error) -> EngineError {
        let probe = self.url(upload.run_id, upload.step_id, "-probe");
        let answer = self.client.request(Method::POST, &probe).send().await;
        if answer.is_ok_and(|r| r.status() == StatusCode::NOT_IMPLEMENTED) {
            return EngineError::ArtifactsUnavailable(
                "the API has no artifact storage configured (HTTP 501)".to_string(),
            );
        }
        io(format!(
            "artifact {:?} upload was cut off: {e} (the API refuses artifacts over its size \
             limit, 128 MiB for ironflow-api 3.1, with HTTP 413)",
            upload.name
        ))
    }
}

fn io(msg: String) -> EngineError {
    EngineError::Artifact(ArtifactError::Io(msg))
}

impl ArtifactSink for ApiArtifactSink {
    fn put<'a>(
        &'a self,
        upload: ArtifactUpload,
        content: ByteStream,
    ) -> ArtifactFuture<'a, Artifact> {
        Box::pin(async move {
            let url = self.url(upload.run_id, upload.step_id, &upload.name);
            let resp = self
                .client
                .request(Method::POST, &url)
                .header(reqwest::header::CONTENT_TYPE, &upload.content_type)
                .body(Body::wrap_stream(content))
                .send()
                .await;
            let resp = match resp {
                Ok(resp) => resp,
                Err(e) => return Err(self.diagnose_cut_upload(&upload, e).await),
            };
            let status = resp.status();
            if status.is_success() {
                let envelope: Envelope<Artifact> = resp.json().await.map_err(|e| {
                    io(format!(
                        "artifact {:?}: unreadable API answer: {e}",
                        upload.name
                    ))
                })?;
                return Ok(envelope.data);
            }
            let body = resp.text().await.unwrap_or_default();
            Err(match status {
                StatusCode::PAYLOAD_TOO_LARGE => io(format!(
                    "artifact {:?} is larger than the API accepts (HTTP 413)",
                    upload.name
                )),
                StatusCode::CONFLICT => EngineError::Store(StoreError::DuplicateArtifact {
                    step_id: upload.step_id,
                    name: upload.name,
                }),
                StatusCode::NOT_IMPLEMENTED => EngineError::ArtifactsUnavailable(
                    "the API has no artifact storage configured (HTTP 501)".to_string(),
                ),
                _ => io(format!(
                    "artifact {:?} upload failed: HTTP {status}: {body}",
                    upload.name
                )),
            })
        })
    }

    fn get<'a>(&'a self, artifact: &'a Artifact) -> ArtifactFuture<'a, ByteStream> {
        Box::pin(async move {
            let url = self.url(artifact.run_id, artifact.step_id, &artifact.name);
            let resp = self
                .client
                .request(Method::GET, &url)
                .send()
                .await
                .map_err(|e| io(format!("artifact {:?} download failed: {e}", artifact.name)))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(match status {
                    StatusCode::NOT_FOUND => {
                        EngineError::Artifact(ArtifactError::NotFound(artifact.name.clone()))
                    }
                    StatusCode::NOT_IMPLEMENTED => EngineError::ArtifactsUnavailable(
                        "the API has no artifact storage configured (HTTP 501)".to_string(),
                    ),
                    StatusCode::METHOD_NOT_ALLOWED => EngineError::ArtifactsUnavailable(format!(
                        "the API does not serve artifact downloads to workers (GET {url}: HTTP 405): \
                         artifact {:?} cannot be an input of a step run on Lambda",
                        artifact.name
                    )),
                    _ => io(format!(
                        "artifact {:?} download failed: HTTP {status}",
                        artifact.name
                    )),
                });
            }
            let stream = resp
                .bytes_stream()
                .map_ok(Bytes::from)
                .map_err(|e| ArtifactError::Io(e.to_string()));
            Ok(Box::pin(stream) as ByteStream)
        })
    }
}
