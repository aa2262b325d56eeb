//! AWS Signature Version 4 for one request (the CloudWatch analysis provider, issue 75), as
//! AWS documents it: a canonical request, a string to sign over its SHA-256, and an HMAC
//! chain from the secret key through date, region, service and `aws4_request`. Pure: the
//! time is passed in. Checked against AWS's published test suite (`get-vanilla`,
//! `post-vanilla`, `get-vanilla-query-order-key-case`).

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::text::percent_encoded;

/// Long-term or temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// With temporary credentials; sent and signed as `x-amz-security-token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    // The secret and the token never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// What is signed: the request as sent.
pub struct Request<'a> {
    pub method: &'a str,
    /// `host[:port]` as in the `Host` header.
    pub host: &'a str,
    /// The path, already URI-encoded; `/` when empty.
    pub path: &'a str,
    /// Query parameters, not yet encoded.
    pub query: &'a [(&'a str, &'a str)],
    /// Further headers to sign (e.g. `content-type`, `x-amz-target`), lowercase names.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    pub region: &'a str,
    pub service: &'a str,
}

/// The headers to add to the request.
#[derive(Debug, PartialEq, Eq)]
pub struct Signature {
    pub authorization: String,
    pub amz_date: String,
    pub security_token: Option<String>,
}

/// Signs `request` at `now`.
pub fn sign(request: &Request, credentials: &Credentials, now: jiff::Timestamp) -> Signature {
    let amz_date = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let date = &amz_date[..8];
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), request.host.trim().into()),
        ("x-amz-date".into(), amz_date.clone()),
    ];
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token".into(), token.trim().into()));
    }
    for (name, value) in request.headers {
        headers.push((name.to_ascii_lowercase(), collapse_spaces(value)));
    }
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        if request.path.is_empty() {
            "/"
        } else {
            request.path
        },
        canonical_query(request.query),
        hex(&Sha256::digest(request.body)),
    );
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", credentials.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [request.region, request.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    Signature {
        authorization: format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, \
             Signature={signature}",
            credentials.access_key_id
        ),
        amz_date,
        security_token: credentials.session_token.clone(),
    }
}

/// Parameters sorted by encoded name, then value, each RFC 3986-encoded.
fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (percent_encoded(k), percent_encoded(v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn collapse_spaces(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length; new_from_slice cannot fail for it.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's SigV4 test suite: its example credentials, region, service and time.
    fn suite(method: &'static str, query: &'static [(&'static str, &'static str)]) -> Signature {
        let credentials = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let request = Request {
            method,
            host: "example.amazonaws.com",
            path: "/",
            query,
            headers: &[],
            body: b"",
            region: "us-east-1",
            service: "service",
        };
        sign(
            &request,
            &credentials,
            "2015-08-30T12:36:00Z".parse().unwrap(),
        )
    }

    #[test]
    fn the_suites_vanilla_requests_sign_as_published() {
        let get = suite("GET", &[]);
        assert_eq!(get.amz_date, "20150830T123600Z");
        assert_eq!(
            get.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        assert!(suite("POST", &[]).authorization.ends_with(
            "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        ));
        // get-vanilla-query-order-key-case: parameters are signed sorted.
        assert!(
            suite("GET", &[("Param2", "value2"), ("Param1", "value1")])
                .authorization
                .ends_with(
                    "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
                )
        );
    }

    #[test]
    fn a_session_token_is_signed_and_credentials_do_not_print_the_secret() {
        let credentials = Credentials {
            access_key_id: "AKID".into(),
            secret_access_key: "s3cret".into(),
            session_token: Some("t0ken".into()),
        };
        let request = Request {
            method: "POST",
            host: "monitoring.eu-west-1.amazonaws.com",
            path: "/",
            query: &[],
            headers: &[("content-type", "application/x-amz-json-1.0")],
            body: b"{}",
            region: "eu-west-1",
            service: "monitoring",
        };
        let signed = sign(&request, &credentials, jiff::Timestamp::UNIX_EPOCH);
        assert!(
            signed
                .authorization
                .contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,"),
            "{}",
            signed.authorization
        );
        assert_eq!(signed.security_token.as_deref(), Some("t0ken"));
        let printed = format!("{credentials:?}");
        assert!(
            !printed.contains("s3cret") && !printed.contains("t0ken"),
            "{printed}"
        );
    }
}
