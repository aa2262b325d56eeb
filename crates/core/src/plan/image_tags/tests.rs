use proptest::prelude::*;

use super::*;
use crate::api::{ImagePolicySpec, Ordered, SemverOrder, TagFilter, TagOrder};

fn semver(range: &str) -> ImagePolicySpec {
    ImagePolicySpec {
        image: "r.example/web".into(),
        policy: TagOrder {
            semver: Some(SemverOrder {
                range: range.into(),
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn numerical(order: Direction, filter: Option<(&str, &str)>) -> ImagePolicySpec {
    ImagePolicySpec {
        image: "r.example/web".into(),
        policy: TagOrder {
            numerical: Some(Ordered { order }),
            ..Default::default()
        },
        filter_tags: filter.map(|(p, e)| TagFilter {
            pattern: p.into(),
            extract: e.into(),
        }),
        ..Default::default()
    }
}

fn newest<'a>(spec: &ImagePolicySpec, tags: &[&'a str]) -> Option<&'a str> {
    TagPolicy::new(spec).unwrap().newest(tags.iter().copied())
}

#[test]
fn cosigns_signature_tags_are_never_picked_even_alphabetically() {
    let sig = format!("sha256-{}.sig", "f".repeat(64));
    let att = format!("sha256-{}.att", "e".repeat(64));
    let spec = ImagePolicySpec {
        image: "r.example/web".into(),
        policy: TagOrder {
            alphabetical: Some(Ordered {
                order: Direction::Asc,
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        newest(&spec, &["2026-12-01", &sig, &att, "2026-12-04"]),
        Some("2026-12-04")
    );
    assert!(is_signature_artifact(&sig));
    assert!(!is_signature_artifact("sha256-abc.sig"));
    assert!(!is_signature_artifact(&format!(
        "sha256-{}.tar",
        "f".repeat(64)
    )));
}

#[test]
fn verify_needs_pem_public_keys() {
    let mut spec = semver("1.x");
    let key = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n".to_string();
    spec.verify = Some(crate::api::ImageVerification {
        cosign: crate::api::CosignVerification {
            public_keys: vec![key.clone()],
        },
    });
    assert!(TagPolicy::new(&spec).is_ok());
    for keys in [vec![], vec!["AAAA".to_string()], vec![key; 17]] {
        spec.verify = Some(crate::api::ImageVerification {
            cosign: crate::api::CosignVerification { public_keys: keys },
        });
        let Err(e) = TagPolicy::new(&spec) else {
            panic!("keys {:?} were taken", spec.verify);
        };
        assert_eq!(e.field(), ["spec", "verify", "cosign", "publicKeys"]);
    }
}

#[test]
fn newest_build_picks_the_tag_built_last_and_holds_a_failed_one() {
    let spec = ImagePolicySpec {
        image: "r.example/web".into(),
        policy: TagOrder {
            newest_build: Some(crate::api::NewestBuild {}),
            ..Default::default()
        },
        filter_tags: Some(TagFilter {
            pattern: "^main-".into(),
            extract: String::new(),
        }),
        ..Default::default()
    };
    let policy = TagPolicy::new(&spec).unwrap();
    assert!(policy.needs_build_times());
    assert_eq!(
        policy.candidates(["main-a1", "pr-7", "main-b2"]),
        vec!["main-a1", "main-b2"]
    );
    let at = |s: &str| Some(s.parse::<jiff::Timestamp>().unwrap());
    let built = [
        ("main-b2", at("2026-12-04T10:00:00Z")),
        ("main-a1", at("2026-12-04T11:00:00Z")),
        ("main-zz", None),
        ("pr-7", at("2026-12-04T12:00:00Z")),
    ];
    assert_eq!(
        policy.choose_built(built, |_| false),
        Choice::Tag("main-a1")
    );
    assert_eq!(
        policy.choose_built(built, |t| t == "main-a1"),
        Choice::HoldFailed("main-a1")
    );
    assert_eq!(
        policy.choose_built([("main-x", None)], |_| false),
        Choice::Nothing
    );
    // Two orders at once are refused.
    let mut two = spec.clone();
    two.policy.numerical = Some(Ordered::default());
    assert!(matches!(
        TagPolicy::new(&two),
        Err(PolicyError::Orders { found: 2 })
    ));
}

#[test]
fn a_rollouts_image_source_names_the_policy_and_commit_that_wrote_its_image() {
    let mut origins = ImageOrigins::default();
    // A history walk goes from the newest: an older commit of the same image does not win.
    origins.record(
        "r.example/web:1.1.0",
        Some("sha256:ab"),
        "web",
        "1a2b3c4d5e6f7a8b",
        false,
    );
    origins.record(
        "r.example/web:1.1.0",
        None,
        "old",
        "ffffffffffffffff",
        false,
    );
    let text = "r.example/web:1.1.0 (sha256:ab) from ImagePolicy web, commit 1a2b3c4d5e6f";
    assert_eq!(origins.of("r.example/web:1.1.0"), Some(text));
    // A pinned reference is the same image.
    assert_eq!(origins.of("r.example/web:1.1.0@sha256:ab"), Some(text));
    // A commit made now replaces what history said.
    origins.record("r.example/web:1.1.0", None, "web", "0123456789abcdef", true);
    assert!(
        origins
            .of("r.example/web:1.1.0")
            .unwrap()
            .ends_with("0123456789ab")
    );

    // The status keeps what it said while the image is the same and nothing newer is known,
    // and drops it for an image a person wrote.
    let said = Some(text.to_string());
    assert_eq!(
        image_source("r.example/web:1.1.0", None, said.clone()),
        said
    );
    assert_eq!(
        image_source("r.example/web:1.1.0@sha256:ab", None, said.clone()),
        said
    );
    assert_eq!(
        image_source("r.example/web:1.2.0", None, said.clone()),
        None
    );
    assert_eq!(image_source("r.example/web:1.1", None, said), None);
    assert_eq!(
        image_source("x:1", Some("x:1 from ImagePolicy x, commit 1".into()), None).as_deref(),
        Some("x:1 from ImagePolicy x, commit 1")
    );
}

#[test]
fn semver_picks_the_highest_version_in_the_range() {
    let tags = [
        "1.0.0",
        "1.4.2",
        "1.10.0",
        "2.0.0",
        "latest",
        "1.11.0-rc.1",
        "v1.9.9",
    ];
    assert_eq!(newest(&semver(">=1.0.0 <2.0.0"), &tags), Some("1.10.0"));
    assert_eq!(newest(&semver(">=1.0.0, <2.0.0"), &tags), Some("1.10.0"));
    assert_eq!(newest(&semver(">= 1.0.0 < 1.5"), &tags), Some("1.4.2"));
    assert_eq!(newest(&semver("^1.9 || ^2"), &tags), Some("2.0.0"));
    assert_eq!(newest(&semver("<1.0.0"), &tags), None);
}

/// Regression: Cargo reads a bare `1.4.2` as `^1.4.2`; Flux, whose ranges these are, reads it
/// as that version exactly.
#[test]
fn a_bare_version_is_that_version_exactly_as_flux_reads_it() {
    let tags = ["1.4.2", "1.9.0", "1.4.3"];
    assert_eq!(newest(&semver("1.4.2"), &tags), Some("1.4.2"));
    assert_eq!(newest(&semver(">=v1.4.3"), &tags), Some("1.9.0"));
    assert_eq!(newest(&semver("1.4.x"), &tags), Some("1.4.3"));
}

#[test]
fn docker_hubs_names_go_to_its_api_host() {
    let hub = |i: &str| registry_and_path(i).unwrap();
    assert_eq!(
        hub("docker.io/nginx"),
        ("registry-1.docker.io".into(), "library/nginx".into())
    );
    assert_eq!(hub("docker.io/library/nginx").1, "library/nginx");
    assert_eq!(
        hub("index.docker.io/me/web"),
        ("registry-1.docker.io".into(), "me/web".into())
    );
    assert_eq!(hub("ghcr.io/me/web").0, "ghcr.io");
}

#[test]
fn semver_takes_a_v_prefix_and_a_prerelease_only_when_the_range_names_one() {
    assert_eq!(newest(&semver("1.x"), &["v1.2.0", "1.1.0"]), Some("v1.2.0"));
    let rc = ["1.10.0", "1.11.0-rc.1"];
    assert_eq!(newest(&semver(">=1.0.0"), &rc), Some("1.10.0"));
    assert_eq!(newest(&semver(">=1.11.0-rc.0"), &rc), Some("1.11.0-rc.1"));
}

#[test]
fn numerical_and_alphabetical_order_by_what_the_filter_extracts() {
    let tags = [
        "main-abc123-100",
        "main-def456-99",
        "pr-7-5000",
        "main-xyz-1e9x",
    ];
    let spec = numerical(
        Direction::Asc,
        Some((r"^main-[a-f0-9]+-(?P<ts>[0-9]+)$", "$ts")),
    );
    assert_eq!(newest(&spec, &tags), Some("main-abc123-100"));
    let spec = numerical(
        Direction::Desc,
        Some((r"^main-[a-f0-9]+-(?P<ts>[0-9]+)$", "${ts}")),
    );
    assert_eq!(newest(&spec, &tags), Some("main-def456-99"));
    let mut spec = numerical(Direction::Asc, None);
    spec.policy = TagOrder {
        alphabetical: Some(Ordered::default()),
        ..Default::default()
    };
    assert_eq!(
        newest(&spec, &["2026-12-01", "2026-12-04", "2026-11-30"]),
        Some("2026-12-04")
    );
}

#[test]
fn a_policy_with_no_order_two_orders_a_bad_range_pattern_or_extract_is_refused() {
    let mut none = semver("1.x");
    none.policy = TagOrder::default();
    assert!(matches!(
        TagPolicy::new(&none),
        Err(PolicyError::Orders { found: 0 })
    ));
    let mut two = semver("1.x");
    two.policy.alphabetical = Some(Ordered::default());
    assert!(matches!(
        TagPolicy::new(&two),
        Err(PolicyError::Orders { found: 2 })
    ));
    assert!(matches!(
        TagPolicy::new(&semver(">=one")),
        Err(PolicyError::Range { .. })
    ));
    assert!(matches!(
        TagPolicy::new(&numerical(Direction::Asc, Some(("(", "")))),
        Err(PolicyError::Pattern { .. })
    ));
    assert!(matches!(
        TagPolicy::new(&numerical(
            Direction::Asc,
            Some(("(?P<ts>[0-9]+)", "$build"))
        )),
        Err(PolicyError::Extract { .. })
    ));
    // A pattern that would compile to more than the limit is refused, not built.
    assert!(matches!(
        TagPolicy::new(&numerical(
            Direction::Asc,
            Some((r"\w{1000}\w{1000}\w{1000}", ""))
        )),
        Err(PolicyError::Pattern { .. })
    ));
}

#[test]
fn a_tag_the_oci_grammar_does_not_allow_is_never_picked() {
    let hostile = [
        "1.9.0\nkind: Secret",
        "1.8.0 # x",
        "1.7.0\"",
        ".1.6.0",
        "-1.5.0",
        "1.4.0:x",
    ];
    let mut tags: Vec<&str> = hostile.to_vec();
    tags.push("1.0.0");
    assert_eq!(newest(&semver(">=1.0.0"), &tags), Some("1.0.0"));
    assert!(is_tag("_build.1-x") && !is_tag(""));
}

#[test]
fn a_failed_newest_tag_holds_the_policy_until_a_newer_one_comes() {
    let policy = TagPolicy::new(&semver(">=1.0.0")).unwrap();
    let failed = |t: &str| t == "1.6.0";
    assert_eq!(
        policy.choose(["1.5.0", "1.6.0"], failed),
        Choice::HoldFailed("1.6.0")
    );
    assert_eq!(
        policy.choose(["1.5.0", "1.6.0", "1.7.0"], failed),
        Choice::Tag("1.7.0")
    );
    assert_eq!(policy.choose(["0.9.0"], failed), Choice::Nothing);
}

#[test]
fn a_moved_tag_is_refused_unless_allowed_and_pinning_needs_a_digest() {
    let mut spec = semver(">=1.0.0");
    let (a, b) = ("sha256:aa", "sha256:bb");
    assert_eq!(
        judge_digest(&spec, Some(a), Some(a)),
        DigestVerdict::Write { pinned: None }
    );
    assert_eq!(
        judge_digest(&spec, None, None),
        DigestVerdict::Write { pinned: None }
    );
    assert_eq!(
        judge_digest(&spec, Some(a), Some(b)),
        DigestVerdict::Moved {
            before: a.into(),
            now: b.into()
        }
    );
    spec.allow_moved_tags = true;
    assert_eq!(
        judge_digest(&spec, Some(a), Some(b)),
        DigestVerdict::Write { pinned: None }
    );
    spec.digest_pinning = true;
    assert_eq!(
        judge_digest(&spec, Some(a), Some(b)),
        DigestVerdict::Write {
            pinned: Some(b.into())
        }
    );
    assert_eq!(
        judge_digest(&spec, None, None),
        DigestVerdict::NoDigestToPin
    );
}

#[test]
fn a_tag_longer_than_the_oci_limit_is_never_picked() {
    let long = format!("9{}", "0".repeat(MAX_TAG_BYTES));
    let tags = [long.as_str(), "5"];
    assert_eq!(newest(&numerical(Direction::Asc, None), &tags), Some("5"));
}

proptest! {
    /// The pick is an allowed tag, no allowed tag is newer, and the order of the list does
    /// not matter.
    #[test]
    fn the_pick_is_the_newest_allowed_whatever_the_list_order(
        versions in proptest::collection::vec((0u64..4, 0u64..12, 0u64..12, any::<bool>()), 0..40),
        rotate in 0usize..40,
    ) {
        let tags: Vec<String> = versions
            .iter()
            .map(|(a, b, c, v)| format!("{}{a}.{b}.{c}", if *v { "v" } else { "" }))
            .collect();
        let spec = semver(">=1.0.0 <3.0.0");
        let policy = TagPolicy::new(&spec).unwrap();
        let picked = policy.newest(tags.iter().map(String::as_str));
        let parse = |t: &str| semver::Version::parse(t.trim_start_matches('v')).unwrap();
        let allowed: Vec<&String> = tags.iter().filter(|t| (1..3).contains(&parse(t).major)).collect();
        match picked {
            None => prop_assert!(allowed.is_empty()),
            Some(p) => {
                prop_assert!(allowed.iter().any(|t| t.as_str() == p));
                prop_assert!(allowed.iter().all(|t| parse(t) <= parse(p)));
            }
        }
        let mut rotated = tags.clone();
        if !rotated.is_empty() {
            let n = rotate % rotated.len();
            rotated.rotate_left(n);
        }
        prop_assert_eq!(policy.newest(rotated.iter().map(String::as_str)), picked);
    }
}
