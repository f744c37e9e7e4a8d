//! Who sent a webhook request: the ironflow API, proved by the HMAC-SHA256 of the body in
//! `X-Signature-256` (`sha256=<hex>`, as ironflow-engine's `WebhookSubscriber` signs), or, for
//! an API that does not sign, by the `token` query parameter of the URL it posts to.
//!
//! Invariants: both checks take the same time whatever the bytes compared (`Hmac::verify_slice`
//! and `subtle`'s equality); a request that carries a signature is judged by it alone (a good
//! token does not save a bad signature: the body was altered); nothing here logs the secret,
//! the signature, the token or the body.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::settings::WebhookSecret;

/// The signature header ironflow's webhook sends.
pub const SIGNATURE_HEADER: &str = "x-signature-256";
/// The query parameter that carries the token, for an API that does not sign.
pub const TOKEN_PARAMETER: &str = "token";

/// How a request proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// A valid `X-Signature-256`.
    Signature,
    /// The right `token` in the URL.
    Token,
}

/// Why a request was refused (the 401's reason, logged without any secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Neither a signature nor a token.
    #[error("no X-Signature-256 header and no token in the URL")]
    Missing,
    /// The signature is not `sha256=` and 64 hex digits.
    #[error("X-Signature-256 is not sha256=<64 hex digits>")]
    MalformedSignature,
    /// The signature does not match the body (wrong secret, or the body was altered).
    #[error("X-Signature-256 does not match the body")]
    WrongSignature,
    /// The token is not the secret.
    #[error("the token in the URL is wrong")]
    WrongToken,
}

/// Check a request: its `signature` header (if any), its `token` parameter (if any) and the raw
/// `body` the signature covers.
///
/// # Errors
///
/// The [`Refusal`] when neither proves the sender.
pub fn check(
    secret: &WebhookSecret,
    signature: Option<&str>,
    token: Option<&str>,
    body: &[u8],
) -> Result<Proof, Refusal> {
    if let Some(signature) = signature {
        let digest = signature
            .trim()
            .strip_prefix("sha256=")
            .and_then(|hex_digits| hex::decode(hex_digits).ok())
            .filter(|d| d.len() == 32)
            .ok_or(Refusal::MalformedSignature)?;
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
            .map_err(|_| Refusal::WrongSignature)?;
        mac.update(body);
        return mac
            .verify_slice(&digest)
            .map(|()| Proof::Signature)
            .map_err(|_| Refusal::WrongSignature);
    }
    match token {
        Some(token) if bool::from(token.as_bytes().ct_eq(secret.expose().as_bytes())) => {
            Ok(Proof::Token)
        }
        Some(_) => Err(Refusal::WrongToken),
        None => Err(Refusal::Missing),
    }
}

/// The `X-Signature-256` value ironflow's webhook sends for `body` (tests, the local runner's
/// own webhook).
#[cfg(any(test, feature = "test-support"))]
pub fn sign(secret: &WebhookSecret, body: &[u8]) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .unwrap_or_else(|_| unreachable_hmac());
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(any(test, feature = "test-support"))]
#[allow(clippy::panic)]
fn unreachable_hmac() -> Hmac<Sha256> {
    panic!("HMAC-SHA256 takes a key of any length")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> WebhookSecret {
        WebhookSecret::new("0123456789abcdef0123456789abcdef")
    }

    #[test]
    fn a_valid_signature_or_token_proves_the_sender() {
        let body = br#"{"type":"run_created"}"#;
        let signature = sign(&secret(), body);
        assert_eq!(
            check(&secret(), Some(&signature), None, body),
            Ok(Proof::Signature)
        );
        assert_eq!(
            check(&secret(), None, Some(secret().expose()), body),
            Ok(Proof::Token)
        );
    }

    #[test]
    fn missing_wrong_altered_and_malformed_are_refused() {
        let body = br#"{"type":"run_created"}"#;
        let signature = sign(&secret(), body);
        assert_eq!(check(&secret(), None, None, body), Err(Refusal::Missing));
        assert_eq!(
            check(
                &secret(),
                Some(&signature),
                None,
                br#"{"type":"run_created "}"#
            ),
            Err(Refusal::WrongSignature),
            "an altered body"
        );
        let other = WebhookSecret::new("another-secret-of-thirty-two-chars!!");
        assert_eq!(
            check(&other, Some(&signature), None, body),
            Err(Refusal::WrongSignature),
            "another secret"
        );
        for bad in ["sha1=abc", "sha256=zz", "sha256=abcd", ""] {
            assert_eq!(
                check(&secret(), Some(bad), None, body),
                Err(Refusal::MalformedSignature),
                "{bad:?}"
            );
        }
        assert_eq!(
            check(
                &secret(),
                None,
                Some("0123456789abcdef0123456789abcdeX"),
                body
            ),
            Err(Refusal::WrongToken)
        );
        assert_eq!(
            check(&secret(), None, Some("short"), body),
            Err(Refusal::WrongToken)
        );
        // A bad signature is not saved by a good token.
        assert_eq!(
            check(&secret(), Some("sha256=00"), Some(secret().expose()), body),
            Err(Refusal::MalformedSignature)
        );
    }
}
