//! libgit2's object cache stays within the cap the agent sets (issue 51): at 10,000 rollouts a
//! 16 MiB cap let the write-back's pushes keep 34 MiB of old status trees. A file of its own:
//! `configure_git` writes process-wide settings and must run before any other thread uses Git.

use std::time::Duration;

use git2::{Repository, Signature};

#[allow(unsafe_code)]
fn cached_memory() -> (isize, isize) {
    // SAFETY: reads libgit2's global counters; no other thread of this test binary uses Git.
    unsafe { git2::opts::get_cached_memory() }.unwrap_or((-1, -1))
}

#[test]
fn the_object_cache_stays_within_its_cap_over_many_commits_of_a_large_tree() {
    linnet::net::configure_git(Duration::from_secs(10), None).unwrap();
    assert_eq!(cached_memory().1, linnet::net::GIT_OBJECT_CACHE_BYTES);

    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let sig = Signature::now("t", "t@example.com").unwrap();
    let blob = repo.blob(b"phase: Stable\n").unwrap();
    let mut parent: Option<git2::Oid> = None;
    // Like the write-back's status files: 4,000 files in 64 directories, and every commit
    // changes one file in each directory, so each commit has 65 new trees.
    for commit in 0..60 {
        let mut root = repo.treebuilder(None).unwrap();
        for d in 0..64 {
            let mut sub = repo.treebuilder(None).unwrap();
            for f in 0..62 {
                let name = if f == 0 {
                    format!("rollout-{d}-{f}-{commit}.yaml")
                } else {
                    format!("rollout-{d}-{f}.yaml")
                };
                sub.insert(name, blob, 0o100644).unwrap();
            }
            let sub = sub.write().unwrap();
            root.insert(format!("{d:02x}"), sub, 0o040000).unwrap();
        }
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p).unwrap())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        parent = Some(
            repo.commit(None, &sig, &sig, "status", &tree, &parents)
                .unwrap(),
        );
    }
    // Read every tree of every commit, as a push's pack walk does.
    let odb = repo.odb().unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push(parent.unwrap()).unwrap();
    let (mut trees, mut read) = (0, 0);
    for oid in walk {
        let tree = repo.find_commit(oid.unwrap()).unwrap().tree().unwrap();
        for entry in tree.iter() {
            let sub = repo.find_tree(entry.id()).unwrap();
            trees += 1;
            read += odb.read_header(entry.id()).unwrap().0;
            assert_eq!(sub.len(), 62);
        }
    }
    assert_eq!(trees, 60 * 64);
    // The trees read must be more than the cap, or nothing here makes the cache evict.
    let (current, allowed) = cached_memory();
    assert!(
        read > 2 * allowed.unsigned_abs(),
        "only {read} bytes of trees read, cap {allowed}"
    );
    assert!(current <= allowed, "cached {current} bytes, cap {allowed}");
    assert!(current > 0, "the cache is in use");
}
