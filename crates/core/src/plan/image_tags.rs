//! Which tag an [`ImagePolicy`] picks from a repository's tags (issue 74), and what is wrong
//! with a policy before any tag is read. Pure: the registry scanner hands the tags in.
//!
//! Tags come from a registry anyone who can push an image controls, so nothing here is more
//! than linear in their size: the filter is a `regex` (no backtracking), with a compiled-size
//! bound, and a tag longer than the OCI limit of 128 bytes is never considered.

use std::cmp::Ordering;

use crate::api::{Direction, ImagePolicySpec, TagFilter};

/// The longest tag the OCI distribution spec allows.
pub const MAX_TAG_BYTES: usize = 128;
/// The largest compiled filter (the `regex` crate's own default is 10 MiB).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Why a policy cannot order tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("set exactly one of semver, alphabetical, numerical and newestBuild (found {found})")]
    Orders { found: usize },
    #[error("semver range {range:?} does not parse: {reason}")]
    Range { range: String, reason: String },
    #[error("filterTags.pattern {pattern:?} does not compile: {reason}")]
    Pattern { pattern: String, reason: String },
    #[error("filterTags.extract {extract:?} names no capture group of the pattern")]
    Extract { extract: String },
    #[error(
        "verify.cosign.publicKeys needs 1 to 16 keys, each a PEM \"-----BEGIN PUBLIC KEY-----\" \
         block (cosign.pub)"
    )]
    PublicKeys,
}

impl PolicyError {
    /// The spec field the error is about, for `file:line:column`.
    pub fn field(&self) -> &'static [&'static str] {
        match self {
            PolicyError::Orders { .. } => &["spec", "policy"],
            PolicyError::Range { .. } => &["spec", "policy", "semver", "range"],
            PolicyError::Pattern { .. } => &["spec", "filterTags", "pattern"],
            PolicyError::Extract { .. } => &["spec", "filterTags", "extract"],
            PolicyError::PublicKeys => &["spec", "verify", "cosign", "publicKeys"],
        }
    }
}

/// cosign's tags beside an image (`sha256-<hex>.sig`, `.att`, `.sbom`): never an image to
/// deploy, though an alphabetical order would rank them first.
pub fn is_signature_artifact(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix("sha256-") else {
        return false;
    };
    let Some((hex, kind)) = rest.split_once('.') else {
        return false;
    };
    hex.len() == 64
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && matches!(kind, "sig" | "att" | "sbom")
}

/// A tag as the OCI distribution spec allows it, `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`: a
/// registry's answer that is anything else (a line break, a quote, a `#`) never reaches Git.
pub fn is_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    first_ok
        && tag.len() <= MAX_TAG_BYTES
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// An image repository's registry host and path there, as Docker reads a name:
/// `registry.example:5000/team/web` → (`registry.example:5000`, `team/web`); a name with no host
/// is Docker Hub's (`web` → `library/web`). `None` when it is no repository name (a tag, a
/// digest, an empty part or a character a reference cannot have).
pub fn registry_and_path(image: &str) -> Option<(String, String)> {
    let valid = |c: char| c.is_ascii_alphanumeric() || "._-/:".contains(c);
    if image.is_empty() || image.len() > 255 || !image.chars().all(valid) {
        return None;
    }
    const HUB: &str = "registry-1.docker.io";
    let (host, path) = match image.split_once('/') {
        // Docker Hub's names for itself serve no registry API: its API host does.
        Some(("docker.io" | "index.docker.io", rest)) if !rest.contains('/') => {
            (HUB, format!("library/{rest}"))
        }
        Some(("docker.io" | "index.docker.io", rest)) => (HUB, rest.to_string()),
        Some((h, rest)) if h.contains(['.', ':']) || h == "localhost" => (h, rest.to_string()),
        Some(_) => (HUB, image.to_string()),
        None => (HUB, format!("library/{image}")),
    };
    // A tag after the last '/' is not a repository.
    if host.is_empty() || path.contains(':') || path.split('/').any(str::is_empty) {
        return None;
    }
    Some((host.to_string(), path))
}

/// What a policy does at one scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice<'a> {
    /// Move the marked lines to this tag.
    Tag(&'a str),
    /// No tag is allowed.
    Nothing,
    /// The newest allowed tag failed in a rollout (a revert named it): nothing moves, neither
    /// to it nor back to an older tag, until a newer one comes.
    HoldFailed(&'a str),
}

/// Whether a picked tag may be written, by its digest now and when it was last committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DigestVerdict {
    /// Write it; with the digest after the tag when `digestPinning` is on.
    Write { pinned: Option<String> },
    /// The tag points at another digest than the one committed before (pushed again).
    Moved { before: String, now: String },
    /// `digestPinning` needs a digest the registry did not give.
    NoDigestToPin,
}

/// The verdict on a picked tag: a moved tag is refused unless `allowMovedTags`; a pinned one
/// needs its digest.
pub fn judge_digest(
    spec: &ImagePolicySpec,
    committed: Option<&str>,
    now: Option<&str>,
) -> DigestVerdict {
    if let (Some(before), Some(now)) = (committed, now)
        && before != now
        && !spec.allow_moved_tags
    {
        return DigestVerdict::Moved {
            before: before.to_string(),
            now: now.to_string(),
        };
    }
    match (spec.digest_pinning, now) {
        (false, _) => DigestVerdict::Write { pinned: None },
        (true, Some(d)) => DigestVerdict::Write {
            pinned: Some(d.to_string()),
        },
        (true, None) => DigestVerdict::NoDigestToPin,
    }
}

/// A policy ready to order tags.
pub struct TagPolicy {
    order: Order,
    filter: Option<(regex::Regex, String)>,
}

enum Order {
    /// Any of the alternatives (`||`).
    Semver(Vec<semver::VersionReq>),
    Alphabetical(Direction),
    Numerical(Direction),
    /// By the image's build time, which the scanner reads ([`TagPolicy::choose_built`]).
    NewestBuild,
}

impl TagPolicy {
    pub fn new(spec: &ImagePolicySpec) -> Result<TagPolicy, PolicyError> {
        let p = &spec.policy;
        let found = [
            p.semver.is_some(),
            p.alphabetical.is_some(),
            p.numerical.is_some(),
            p.newest_build.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        if found != 1 {
            return Err(PolicyError::Orders { found });
        }
        let order = match (&p.semver, &p.alphabetical, &p.numerical) {
            (Some(s), _, _) => Order::Semver(semver_range(&s.range)?),
            (_, Some(a), _) => Order::Alphabetical(a.order),
            (_, _, Some(n)) => Order::Numerical(n.order),
            _ => Order::NewestBuild,
        };
        let filter = spec.filter_tags.as_ref().map(compile_filter).transpose()?;
        if let Some(v) = &spec.verify {
            let keys = &v.cosign.public_keys;
            let armored = |k: &String| {
                let k = k.trim();
                k.starts_with("-----BEGIN PUBLIC KEY-----")
                    && k.ends_with("-----END PUBLIC KEY-----")
            };
            if keys.is_empty() || keys.len() > 16 || !keys.iter().all(armored) {
                return Err(PolicyError::PublicKeys);
            }
        }
        Ok(TagPolicy { order, filter })
    }

    /// The newest tag the policy allows, if any.
    pub fn newest<'a>(&self, tags: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        let mut best: Option<(&'a str, Key)> = None;
        for tag in tags {
            let Some(key) = self.key(tag) else { continue };
            let better = best
                .as_ref()
                .is_none_or(|(held, k)| self.compare(&key, k).then_with(|| tag.cmp(held)).is_gt());
            if better {
                best = Some((tag, key));
            }
        }
        best.map(|(tag, _)| tag)
    }

    /// The scan's choice: the newest tag, unless `failed` says a rollout failed on it.
    pub fn choose<'a>(
        &self,
        tags: impl IntoIterator<Item = &'a str>,
        failed: impl Fn(&str) -> bool,
    ) -> Choice<'a> {
        match self.newest(tags) {
            None => Choice::Nothing,
            Some(tag) if failed(tag) => Choice::HoldFailed(tag),
            Some(tag) => Choice::Tag(tag),
        }
    }

    /// Whether the order is the images' build times, which the scanner must read.
    pub fn needs_build_times(&self) -> bool {
        matches!(self.order, Order::NewestBuild)
    }

    /// The tags the policy considers (its filter, and its range), in no order.
    pub fn candidates<'a>(&self, tags: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        tags.into_iter().filter(|t| self.key(t).is_some()).collect()
    }

    /// The scan's choice by build time (`newestBuild`): the tag built last (the greater tag
    /// of two built at the same second), unless a rollout failed on it. A tag with no time
    /// is left out.
    pub fn choose_built<'a>(
        &self,
        built: impl IntoIterator<Item = (&'a str, Option<jiff::Timestamp>)>,
        failed: impl Fn(&str) -> bool,
    ) -> Choice<'a> {
        let newest = built
            .into_iter()
            .filter(|(tag, _)| self.key(tag).is_some())
            .filter_map(|(tag, at)| Some((at?, tag)))
            .max();
        match newest {
            None => Choice::Nothing,
            Some((_, tag)) if failed(tag) => Choice::HoldFailed(tag),
            Some((_, tag)) => Choice::Tag(tag),
        }
    }

    /// What `tag` is ordered by, or `None` when the policy leaves it out.
    fn key(&self, tag: &str) -> Option<Key> {
        if !is_tag(tag) || is_signature_artifact(tag) {
            return None;
        }
        let value = match &self.filter {
            None => tag.to_string(),
            Some((pattern, extract)) => {
                let caps = pattern.captures(tag)?;
                if extract.is_empty() {
                    tag.to_string()
                } else {
                    let mut out = String::new();
                    caps.expand(extract, &mut out);
                    out
                }
            }
        };
        match &self.order {
            Order::Semver(alternatives) => {
                let version =
                    semver::Version::parse(value.strip_prefix('v').unwrap_or(&value)).ok()?;
                alternatives
                    .iter()
                    .any(|r| r.matches(&version))
                    .then_some(Key::Version(version))
            }
            Order::Alphabetical(_) | Order::NewestBuild => Some(Key::Text(value)),
            Order::Numerical(_) => value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .map(Key::Number),
        }
    }

    fn compare(&self, a: &Key, b: &Key) -> Ordering {
        let natural = match (a, b) {
            (Key::Version(a), Key::Version(b)) => a.cmp(b),
            (Key::Text(a), Key::Text(b)) => a.cmp(b),
            (Key::Number(a), Key::Number(b)) => a.total_cmp(b),
            _ => Ordering::Equal,
        };
        match self.order {
            Order::Alphabetical(Direction::Desc) | Order::Numerical(Direction::Desc) => {
                natural.reverse()
            }
            _ => natural,
        }
    }
}

enum Key {
    Version(semver::Version),
    Text(String),
    Number(f64),
}

/// A range as Flux writes it (`>=1.0.0 <2.0.0`, `^1.2 || ^2`) or as Cargo does
/// (`>=1.0.0, <2.0.0`).
fn semver_range(range: &str) -> Result<Vec<semver::VersionReq>, PolicyError> {
    let error = |reason: String| PolicyError::Range {
        range: range.to_string(),
        reason,
    };
    let mut alternatives = Vec::new();
    for alternative in range.split("||") {
        // Comparators apart by spaces are joined by commas; an operator standing alone
        // (`>= 1.0`) keeps its version.
        let mut parts: Vec<String> = Vec::new();
        for token in alternative
            .split([' ', ',', '\t'])
            .filter(|t| !t.is_empty())
        {
            match parts.last_mut() {
                Some(last) if last.chars().all(|c| "<>=~^".contains(c)) => last.push_str(token),
                _ => parts.push(token.to_string()),
            }
        }
        if parts.is_empty() {
            return Err(error("an alternative is empty".into()));
        }
        for part in &mut parts {
            // As Flux (Masterminds) reads them: a bare version is that version exactly
            // (Cargo would read `^`), and a `v` after the operator is no part of it.
            let op: String = part.chars().take_while(|c| "<>=~^".contains(*c)).collect();
            let version = part[op.len()..].trim_start_matches('v').to_string();
            let op = if op.is_empty() && version.starts_with(|c: char| c.is_ascii_digit()) {
                "=".to_string()
            } else {
                op
            };
            *part = format!("{op}{version}");
        }
        let req = semver::VersionReq::parse(&parts.join(", ")).map_err(|e| error(e.to_string()))?;
        alternatives.push(req);
    }
    Ok(alternatives)
}

fn compile_filter(filter: &TagFilter) -> Result<(regex::Regex, String), PolicyError> {
    let pattern = regex::RegexBuilder::new(&filter.pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| PolicyError::Pattern {
            pattern: filter.pattern.clone(),
            reason: e.to_string(),
        })?;
    let names: Vec<&str> = pattern.capture_names().flatten().collect();
    let groups = pattern.captures_len();
    let mut rest = filter.extract.as_str();
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let name: String = rest
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let known =
            names.contains(&name.as_str()) || name.parse::<usize>().is_ok_and(|n| n < groups);
        if !known {
            return Err(PolicyError::Extract {
                extract: filter.extract.clone(),
            });
        }
    }
    Ok((pattern, filter.extract.clone()))
}

/// Where each image the automation committed came from, by `image:tag`: `image:tag
/// (sha256:…) from ImagePolicy web, commit 1a2b3c4d5e6f`. Read from the branch's history (the
/// automation's trailers), so it is remade after a restart; a rollout's status shows it
/// (`imageSource`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageOrigins(std::collections::BTreeMap<String, String>);

impl ImageOrigins {
    /// Records where `image` (`image:tag`, a digest left out) came from; `newer` replaces
    /// what is recorded, an older one (a history walk from the newest) never does.
    pub fn record(
        &mut self,
        image: &str,
        digest: Option<&str>,
        policy: &str,
        commit: &str,
        newer: bool,
    ) {
        let image = without_digest(image);
        let short = commit.get(..12).unwrap_or(commit);
        let text = match digest {
            Some(d) => format!("{image} ({d}) from ImagePolicy {policy}, commit {short}"),
            None => format!("{image} from ImagePolicy {policy}, commit {short}"),
        };
        if newer {
            self.0.insert(image.to_string(), text);
        } else {
            self.0.entry(image.to_string()).or_insert(text);
        }
    }

    /// Where `image` came from (a pinned `image:tag@digest` is looked up as `image:tag`).
    pub fn of(&self, image: &str) -> Option<&str> {
        self.0.get(without_digest(image)).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn without_digest(image: &str) -> &str {
    image.split_once('@').map_or(image, |(i, _)| i)
}

/// A status's `imageSource`: where the spec's image came from if that is known now, else what
/// the status said if it is about the same image (the automation's history is read again
/// after a restart), else nothing (a person wrote the image).
pub fn image_source(
    spec_image: &str,
    known: Option<String>,
    before: Option<String>,
) -> Option<String> {
    let same = |b: &String| b.starts_with(&format!("{} ", without_digest(spec_image)));
    known.or_else(|| before.filter(same))
}

#[cfg(test)]
mod tests;
