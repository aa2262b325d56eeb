//! Seeded fuzzing of what strangers control: the spec loader (any bytes a push can hold) and
//! the webhook parsers (any request the port can receive), plus the text that leaves linnet.
//! A small mutation fuzzer over a corpus of real specs, YAML bombs and each host's payloads:
//! no input may panic, exceed the parse budget's memory, or take long. It runs a fixed number
//! of cases (`LINNET_FUZZ_CASES`, default 20,000 per target) from a fixed seed
//! (`LINNET_FUZZ_SEED`), so a failure prints the seed and case that reproduce it; `make fuzz`
//! runs more.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue};
use linnet::source::webhook::{
    GitHost, delivery_id, parse_event, same_repository, sign_hex, verify,
};
use linnet::specs::{LoadOptions, load_file};
use linnet::text::{one_line, redact_credentials};

/// xorshift64*: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seed() -> u64 {
    std::env::var("LINNET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6C69_6E6E_6574)
}

fn cases() -> usize {
    std::env::var("LINNET_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}

/// Tokens that steer YAML and JSON into their odd corners.
const DICTIONARY: &[&str] = &[
    "&a ",
    "*a",
    "&b [*a, *a, *a, *a]",
    "<<: *a",
    "<<: [*a, *b]",
    "---\n",
    "...\n",
    "? ",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "!!binary ",
    "!!str ",
    "!!merge ",
    "!custom ",
    "|\n  ",
    ">-\n  ",
    "\"\\u0000\"",
    "'",
    "\"",
    "#",
    "\t",
    "\r\n",
    "\u{feff}",
    "\u{202e}",
    "0x1F",
    "1e999",
    ".nan",
    "~",
    "null",
    "true",
    "kind: Namespace",
    "apiVersion: v1",
    "metadata:\n  name: x\n",
    "namespace: kube-system",
    "linnet.dev/",
    "\"ref\":",
    "\"after\":",
    "\"repository\":{\"full_name\":",
    "refs/heads/main",
    "0000000000000000000000000000000000000000",
    "http://u:p@h/",
    "\\n",
    "{\"a\":",
    "[[[[[[[[",
];

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = corpus[rng.below(corpus.len())].clone();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(data.len() + 1);
        match rng.below(6) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            2 if !data.is_empty() => {
                let end = (at + rng.below(64)).min(data.len());
                data.drain(at.min(end)..end);
            }
            3 if !data.is_empty() => {
                // Repeat a slice: nesting and long scalars.
                let start = rng.below(data.len());
                let end = (start + 1 + rng.below(32)).min(data.len());
                let piece: Vec<u8> = data[start..end].to_vec();
                for _ in 0..1 + rng.below(8) {
                    data.splice(at..at, piece.iter().copied());
                }
            }
            4 => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len());
                let end = (from + rng.below(256)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ => {
                let byte = (rng.next() & 0xff) as u8;
                data.insert(at, byte);
            }
        }
    }
    data
}

fn spec_corpus() -> Vec<Vec<u8>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo/apps");
    let mut corpus: Vec<Vec<u8>> = ["redis/redis.yaml", "redis/service.yaml", "web/web.yaml"]
        .iter()
        .map(|f| std::fs::read(root.join(f)).unwrap())
        .collect();
    corpus.push(
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: &l {app: x}\n  annotations: *l\ndata:\n  k: v\n"
            .to_vec(),
    );
    corpus.push(
        b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n"
            .to_vec(),
    );
    corpus.push(
        b"a0: &a0 {k: v}\na1: &a1 {<<: [*a0], x: [*a0, *a0]}\na2: {<<: [*a1], y: [*a1, *a1]}\n"
            .to_vec(),
    );
    corpus
}

/// Runs `check` on `cases()` mutated inputs; a panic or a slow case names its seed and case.
fn fuzz(name: &str, corpus: &[Vec<u8>], mut check: impl FnMut(&[u8])) {
    let (seed, cases) = (seed(), cases());
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for case in 0..cases {
        let input = mutate(&mut rng, corpus);
        let one = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&input)));
        let took = one.elapsed();
        slowest = slowest.max(took);
        assert!(
            outcome.is_ok(),
            "{name}: case {case} of seed {seed} panicked; input: {:?}",
            String::from_utf8_lossy(&input)
        );
        // A hang detector, far above any real case (which take microseconds).
        assert!(
            took < Duration::from_secs(5),
            "{name}: case {case} of seed {seed} took {took:?}; input: {:?}",
            String::from_utf8_lossy(&input)
        );
    }
    println!(
        "{name}: {cases} cases from seed {seed} in {:?}; slowest {slowest:?}",
        started.elapsed()
    );
}

#[test]
fn fuzz_the_spec_loader() {
    let opts = LoadOptions::default();
    fuzz("spec loader", &spec_corpus(), |input| {
        let specs = load_file("fuzz.yaml", input, &opts);
        for e in &specs.errors {
            assert!(e.location.line >= 1 && e.location.column >= 1, "{e}");
            assert_eq!(&*e.location.file, "fuzz.yaml");
        }
        // Whatever loaded fits the budget: no object holds more than the file may expand to.
        let size: usize = specs
            .objects
            .iter()
            .map(|o| {
                serde_json::to_vec(&o.spec.to_json())
                    .map(|v| v.len())
                    .unwrap_or(0)
            })
            .sum();
        assert!(
            size <= 2 * opts.budget.max_bytes + 1024 * 1024,
            "{size} bytes"
        );
    });
}

fn webhook_corpus() -> Vec<Vec<u8>> {
    [
        r#"{"ref":"refs/heads/main","before":"0000000000000000000000000000000000000000","after":"1111111111111111111111111111111111111111","repository":{"full_name":"acme/gitops"}}"#,
        r#"{"object_kind":"push","ref":"refs/heads/main","after":"2222","project":{"path_with_namespace":"g/s/app"}}"#,
        r#"{"push":{"changes":[{"new":{"type":"branch","name":"main","target":{"hash":"4444"}}}]},"repository":{"full_name":"w/r"}}"#,
        r#"{"eventKey":"repo:refs_changed","repository":{"slug":"app","project":{"key":"P"}},"changes":[{"ref":{"id":"refs/heads/main"},"toHash":"5555"}]}"#,
        r#"{"zen":"Design for failure.","hook_id":1}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

const HEADER_NAMES: &[&str] = &[
    "x-github-event",
    "x-gitlab-event",
    "x-gitea-event",
    "x-event-key",
    "x-hub-signature-256",
    "x-hub-signature",
    "x-gitea-signature",
    "x-gitlab-token",
    "x-linnet-signature",
    "x-github-delivery",
    "x-request-uuid",
];

#[test]
fn fuzz_the_webhook_parsers() {
    const SECRET: &[u8] = b"fuzz-secret-0123456789";
    let mut rng = Rng(seed() ^ 0x5555);
    fuzz("webhook parsers", &webhook_corpus(), |body| {
        let mut headers = HeaderMap::new();
        for _ in 0..rng.below(5) {
            let name = HeaderName::from_static(HEADER_NAMES[rng.below(HEADER_NAMES.len())]);
            let value = match rng.below(4) {
                0 => format!("sha256={}", sign_hex(SECRET, body)),
                1 => sign_hex(SECRET, body),
                2 => "push".to_string(),
                _ => String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned(),
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
        for host in GitHost::ALL {
            let verified = verify(host, &headers, body, SECRET).is_ok();
            if verified && host != GitHost::GitLab {
                // Only a signature of this very body verifies.
                let signed = headers.values().any(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.ends_with(&sign_hex(SECRET, body)))
                });
                assert!(signed);
            }
            if let Ok(delivery) = parse_event(host, &headers, body) {
                let _ = delivery.event.touches_branch("main");
                for name in &delivery.repositories {
                    let _ = same_repository("https://github.com/acme/gitops.git", name);
                }
            }
        }
        let _ = delivery_id(&headers);
        let text = String::from_utf8_lossy(body);
        let line = one_line(&text, 200);
        assert!(line.chars().count() <= 200);
        assert!(!line.chars().any(|c| c.is_control()));
        let redacted = redact_credentials(&format!("cannot reach https://u:{text}@h/x"));
        if !text.contains(['/', '?', '#', '"', '@'])
            && !text.chars().any(char::is_whitespace)
            && !text.is_empty()
        {
            assert!(!redacted.contains(&format!(":{text}@")), "{redacted}");
        }
    });
}

/// A random tree in `repo`: wide and deep, subtrees named many times over (bombs), files,
/// links and submodules; returns its id.
fn random_tree(
    repo: &git2::Repository,
    rng: &mut Rng,
    depth: usize,
    made: &mut Vec<git2::Oid>,
) -> git2::Oid {
    let blob = repo
        .blob(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
        .unwrap();
    let mut b = repo.treebuilder(None).unwrap();
    let width = match rng.below(4) {
        0 => rng.below(400),
        _ => rng.below(12),
    };
    for i in 0..width {
        let name = format!("e{i}.yaml");
        match rng.below(8) {
            0 | 1 if depth < 6 => {
                // A fresh subtree, or one made before (shared: the bomb's shape).
                // At most 60 distinct trees a case; past that, shared ones.
                let sub = if !made.is_empty() && (made.len() >= 60 || rng.below(2) == 0) {
                    made[rng.below(made.len())]
                } else {
                    random_tree(repo, rng, depth + 1, made)
                };
                b.insert(&name, sub, 0o040000).unwrap();
            }
            2 => {
                b.insert(&name, blob, 0o120000).unwrap();
            }
            3 if !made.is_empty() => {
                // A submodule entry names a commit; any id will do.
                b.insert(&name, made[0], 0o160000).unwrap();
            }
            _ => {
                b.insert(&name, blob, 0o100644).unwrap();
            }
        }
    }
    let id = b.write().unwrap();
    made.push(id);
    id
}

/// Random repository shapes through the listing's budgets (issue 45): whatever the shape, the
/// files listed stay within `--max-files`, each blocked directory is one entry, and a listing
/// takes no time, however many paths the trees stand for.
#[test]
fn fuzz_repository_shapes() {
    use linnet::source::git::{BLOCKED, GitAuth, GitMirror, GitRemote};
    use linnet::specs::RevisionShape;
    let (seed, cases) = (seed(), (cases() / 200).max(20));
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let bare = tmp.path().join("remote.git");
    let repo = git2::Repository::init_bare(&bare).unwrap();
    let shape = RevisionShape {
        max_files: 300,
        max_tree_entries: 200,
    };
    let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
    let mirror = GitMirror::open(
        &tmp.path().join("cache"),
        GitRemote {
            url: format!("file://{}", bare.display()),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        },
    )
    .unwrap();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for case in 0..cases {
        let mut made = Vec::new();
        let root = random_tree(&repo, &mut rng, 0, &mut made);
        let tree = repo.find_tree(root).unwrap();
        let parents: Vec<git2::Commit> = repo
            .refname_to_id("refs/heads/main")
            .ok()
            .and_then(|id| repo.find_commit(id).ok())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "case", &tree, &parents)
            .unwrap();
        let tip = mirror.fetch().unwrap();
        let one = Instant::now();
        let listing = mirror.list_files_within(tip, "", &shape).unwrap();
        let took = one.elapsed();
        slowest = slowest.max(took);
        let blocked = listing
            .iter()
            .filter(|(_, id)| id.starts_with(BLOCKED))
            .count();
        assert!(
            listing.len() - blocked <= shape.max_files,
            "case {case} of seed {seed}: {} files listed",
            listing.len() - blocked
        );
        assert!(
            listing
                .iter()
                .filter(|(_, id)| id.starts_with(BLOCKED))
                .all(|(p, _)| p.ends_with('/')),
            "case {case} of seed {seed}: a blocked entry is not a directory"
        );
        assert!(
            took < Duration::from_secs(2),
            "case {case} of seed {seed}: listing took {took:?}"
        );
    }
    println!(
        "repository shapes: {cases} cases from seed {seed} in {:?}; slowest listing {slowest:?}",
        started.elapsed()
    );
}
