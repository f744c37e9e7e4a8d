//! How an AWS SDK call failed: a passing fault (retried, or failed open) or a refusal that every
//! later call would meet too. Shared by the clients that judge their own failures: Bedrock
//! ([`crate::agents`]) and the poison-pill table's cold-start check ([`crate::poison`]).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;

/// Whether `err` is the credential chain finding no credentials, or configured so that it
/// cannot: a call never sent, which no retry can fix. A credential provider that timed out or
/// failed (the instance metadata service, STS) is not: that passes.
pub(crate) fn no_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(credentials) = e.downcast_ref::<CredentialsError>() {
            return matches!(
                credentials,
                CredentialsError::CredentialsNotLoaded(_)
                    | CredentialsError::InvalidConfiguration(_)
            );
        }
        cause = e.source();
    }
    false
}

/// Whether `err` is a passing fault: no answer in time, a connection that failed, an answer
/// that could not be read, a 429 or a 5xx (whatever the error's type), or an error code in
/// `throttled` (a service's throttling codes sent with a 400). Not one: any other 4xx (access
/// denied, an unknown resource, an invalid request), credentials that cannot be loaded
/// ([`no_credentials`]), a request that could not be built.
pub(crate) fn is_passing_fault<E>(err: &SdkError<E, HttpResponse>, throttled: &[&str]) -> bool
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(_) => !no_credentials(err),
        SdkError::ServiceError(service) => {
            let http = service.raw().status().as_u16();
            http == 429
                || http >= 500
                || service.err().code().is_some_and(|c| throttled.contains(&c))
        }
        _ => false,
    }
}
