//! Agent token authentication: every agent stream's `authorization: Bearer <token>` is checked
//! with a TokenReview, with upstream's rules and messages.
//!
//! Beyond upstream (a TokenReview per stream loads the API server when agents reconnect
//! together): successful reviews are cached for a bounded time, never past the token's own
//! expiry, keyed by a hash of token and audience; failures are never cached; the namespace
//! and service account are checked again on every use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use super::Kube;
use crate::metrics::Metrics;

/// Bounds the cache so a flood of distinct tokens cannot grow it without limit.
const MAX_CACHED: usize = 65_536;

/// Who a token must belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub namespace: String,
    pub service_account: String,
    pub audience: String,
}

struct Cached {
    username: String,
    until: Instant,
}

pub struct TokenAuthenticator {
    kube: std::sync::Arc<Kube>,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
}

/// Reads the one `authorization` value and strips the `Bearer ` prefix.
pub fn bearer_token(metadata: &MetadataMap) -> Result<String, String> {
    let values: Vec<_> = metadata.get_all("authorization").iter().collect();
    match values.len() {
        0 => return Err("Authentication context was not found in metadata".into()),
        1 => {}
        n => return Err(format!("too many ({n}) tokens are received")),
    }
    let value = String::from_utf8_lossy(values[0].as_bytes()).into_owned();
    value
        .strip_prefix("Bearer ")
        .map(str::to_string)
        .ok_or_else(|| "received token does not have \"Bearer \" prefix".into())
}

/// Upstream's username checks: `system:serviceaccount:<namespace>:<name>`, matching.
pub fn check_username(username: &str, expected: &Expected) -> Result<(), String> {
    let parts: Vec<&str> = username.split(':').collect();
    if parts.len() != 4 {
        return Err("lookup failed: unexpected username format".into());
    }
    if parts[0] != "system" || parts[1] != "serviceaccount" {
        return Err("lookup failed: username returned is not a service account".into());
    }
    if parts[2] != expected.namespace {
        return Err(format!(
            "lookup failed: incoming request from {:?} namespace. Expected {:?}",
            parts[2], expected.namespace
        ));
    }
    if parts[3] != expected.service_account {
        return Err(format!(
            "lookup failed: incoming request from {:?} service account. Expected {:?}",
            parts[3], expected.service_account
        ));
    }
    Ok(())
}

/// The token's `exp` claim, read without verifying it: it only bounds how long a review
/// the API server made may be reused.
pub fn token_expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    Some(UNIX_EPOCH + Duration::from_secs(exp))
}

fn cache_key(token: &str, audience: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(token.as_bytes());
    hasher.update([0]);
    hasher.update(audience.as_bytes());
    hasher.finalize().into()
}

impl TokenAuthenticator {
    pub fn new(kube: std::sync::Arc<Kube>, ttl: Duration) -> TokenAuthenticator {
        TokenAuthenticator {
            kube,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cached_username(&self, key: &[u8; 32]) -> Option<String> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(key) {
            Some(entry) if entry.until > Instant::now() => Some(entry.username.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        }
    }

    fn remember(&self, key: [u8; 32], token: &str, username: &str) {
        if self.ttl.is_zero() {
            return;
        }
        let mut lifetime = self.ttl;
        if let Some(expiry) = token_expiry(token) {
            match expiry.duration_since(SystemTime::now()) {
                Ok(left) => lifetime = lifetime.min(left),
                Err(_) => return,
            }
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED {
            let now = Instant::now();
            cache.retain(|_, e| e.until > now);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(
            key,
            Cached {
                username: username.to_string(),
                until: Instant::now() + lifetime,
            },
        );
    }

    async fn review(
        &self,
        token: &str,
        audience: &str,
        metrics: &Metrics,
    ) -> Result<String, String> {
        let client = self
            .kube
            .client()
            .await
            .map_err(|e| format!("Failed to authenticate request. err:{e}"))?;
        self.kube.throttle().await;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![audience.to_string()]),
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(client)
            .create(&PostParams::default(), &review)
            .await;
        metrics.kubernetes.token_review(reviewed.is_ok());
        let status = reviewed
            .map_err(|e| format!("Failed to authenticate request. err:{e}"))?
            .status
            .unwrap_or_default();
        if let Some(error) = status.error.filter(|e| !e.is_empty()) {
            return Err(format!("lookup failed: {error}"));
        }
        if status.authenticated != Some(true) {
            return Err("lookup failed: service account jwt not valid".into());
        }
        Ok(status.user.and_then(|u| u.username).unwrap_or_default())
    }

    /// Checks one agent stream's token; the error is the message the agent is sent.
    pub async fn authenticate(
        &self,
        metadata: &MetadataMap,
        expected: &Expected,
        metrics: &Metrics,
    ) -> Result<(), String> {
        // As upstream: only the review and the identity checks are wrapped; metadata problems
        // are reported as they are.
        let wrap = |e: String| format!("Failed to validate authentication token, err:{e}");
        let token = bearer_token(metadata)?;
        let key = cache_key(&token, &expected.audience);
        if let Some(username) = self.cached_username(&key) {
            metrics.kubernetes.token_review_cache_hit();
            return check_username(&username, expected).map_err(wrap);
        }
        let username = self
            .review(&token, &expected.audience, metrics)
            .await
            .map_err(wrap)?;
        check_username(&username, expected).map_err(wrap)?;
        self.remember(key, &token, &username);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> Expected {
        Expected {
            namespace: "kube-system".into(),
            service_account: "konnectivity-agent".into(),
            audience: "system:konnectivity-server".into(),
        }
    }

    #[test]
    fn username_rules_and_messages() {
        let e = expected();
        assert_eq!(
            check_username("system:serviceaccount:kube-system:konnectivity-agent", &e),
            Ok(())
        );
        assert_eq!(
            check_username("alice", &e).unwrap_err(),
            "lookup failed: unexpected username format"
        );
        assert_eq!(
            check_username("system:node:kube-system:x", &e).unwrap_err(),
            "lookup failed: username returned is not a service account"
        );
        assert_eq!(
            check_username("system:serviceaccount:default:konnectivity-agent", &e).unwrap_err(),
            "lookup failed: incoming request from \"default\" namespace. Expected \"kube-system\""
        );
        assert_eq!(
            check_username("system:serviceaccount:kube-system:other", &e).unwrap_err(),
            "lookup failed: incoming request from \"other\" service account. Expected \"konnectivity-agent\""
        );
    }

    #[test]
    fn bearer_rules_and_messages() {
        let mut md = MetadataMap::new();
        assert_eq!(
            bearer_token(&md).unwrap_err(),
            "Authentication context was not found in metadata"
        );
        md.insert("authorization", "Token abc".parse().unwrap());
        assert_eq!(
            bearer_token(&md).unwrap_err(),
            "received token does not have \"Bearer \" prefix"
        );
        md.insert("authorization", "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&md).unwrap(), "abc");
        md.append("authorization", "Bearer def".parse().unwrap());
        assert_eq!(
            bearer_token(&md).unwrap_err(),
            "too many (2) tokens are received"
        );
    }

    #[test]
    fn expiry_is_read_from_the_claims() {
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"exp":4102444800,"sub":"x"}"#);
        let token = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.sig");
        assert_eq!(
            token_expiry(&token),
            Some(UNIX_EPOCH + Duration::from_secs(4_102_444_800))
        );
        assert_eq!(token_expiry("not-a-jwt"), None);
    }
}
