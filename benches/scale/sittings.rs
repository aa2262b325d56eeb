//! The first sync against the floor in alternating sittings (issue 77): linnet's first sync
//! of `n` rollouts (start -> every rollout Stable), then the floor (the same stable sets
//! created straight through the API -> every one Ready), then linnet again, and so on, so that
//! the machine's load moves both alike. Reported: each side's times and the ratio per
//! sitting, whose median is the target. In each linnet sitting, once every rollout is
//! Stable, a few one-file pushes measure webhook -> revision read against `git fetch` of the
//! same push ([`super::fetch`]).

use super::*;

/// Row labels, in the order [`alternating`] gives them (after the fetch rows, before the
/// [`MILESTONES`]).
pub const SITTINGS: [&str; 3] = [
    "   13 sittings: linnet, start -> every rollout Stable",
    "   13 sittings: the floor, its sets created directly -> every one Ready",
    "   13 sittings: linnet over the floor, per sitting (ratio)",
];

/// Where the time goes, beside [`SITTINGS`]: the same sittings' milestones.
pub const MILESTONES: [&str; 4] = [
    "   13 sittings: linnet, start -> every stable set created",
    "   13 sittings: linnet, start -> every stable set Ready",
    "   13 sittings: the floor, start -> every set created",
    "   13 sittings: linnet, start -> every CR applied",
];

/// What one linnet sitting measured.
struct Sitting {
    stable_s: f64,
    crs_s: f64,
    created_s: f64,
    ready_s: f64,
    /// Rollout 0's stable set, as linnet made it: the floor's template.
    template: StatefulSet,
    read_ms: Vec<f64>,
    fetch_ms: Vec<f64>,
}

/// `sittings` pairs of (linnet, floor) at `n`, with `pushes` pushes in each linnet sitting.
pub async fn alternating(
    cfg: &Config,
    admin: &Client,
    n: usize,
    sittings: usize,
    pushes: usize,
) -> Result<Vec<Row>, String> {
    let slow = Duration::from_secs(60 + n as u64 / 2);
    let (mut linnet, mut floor) = (Vec::new(), Vec::new());
    let mut milestones: [Vec<f64>; 4] = Default::default();
    let (mut read_ms, mut fetch_ms) = (Vec::new(), Vec::new());
    for k in 0..sittings {
        log(&format!(
            "size {n}: sitting {} of {sittings}: linnet",
            k + 1
        ));
        let sitting = linnet_sitting(cfg, admin, n, pushes).await?;
        log(&format!(
            "size {n}: sitting {}: linnet {:.1} s (CRs applied {:.1} s, sets created {:.1} s, Ready {:.1} s); the floor",
            k + 1,
            sitting.stable_s,
            sitting.crs_s,
            sitting.created_s,
            sitting.ready_s
        ));
        let direct = direct_sets_ready(admin, &sitting.template, n, slow * 3).await?;
        log(&format!(
            "size {n}: sitting {}: the floor {:.1} s ({:.2} x), kube-apiserver CPU {:.1} s",
            k + 1,
            direct.ready_s,
            sitting.stable_s / direct.ready_s,
            direct.apiserver_cpu_s
        ));
        linnet.push(sitting.stable_s);
        floor.push(direct.ready_s);
        milestones[0].push(sitting.created_s);
        milestones[1].push(sitting.ready_s);
        milestones[2].push(direct.created_s);
        milestones[3].push(sitting.crs_s);
        read_ms.extend(sitting.read_ms);
        fetch_ms.extend(sitting.fetch_ms);
    }
    let ratios: Vec<f64> = linnet.iter().zip(&floor).map(|(l, f)| l / f).collect();
    let (median, _, _) = stats(ratios.clone());
    let mut rows = fetch::rows(n, read_ms, fetch_ms);
    rows.extend([
        Row {
            figure: SITTINGS[0],
            ..row(n, 13, "s", linnet, "-", None)
        },
        Row {
            figure: SITTINGS[1],
            ..row(n, 13, "s", floor, "-", None)
        },
        Row {
            figure: SITTINGS[2],
            ..row(
                n,
                13,
                "x",
                ratios,
                "median <= 1.2",
                (sittings > 0).then_some(median <= 1.2),
            )
        },
    ]);
    for (label, v) in MILESTONES.into_iter().zip(milestones) {
        rows.push(Row {
            figure: label,
            ..row(n, 13, "s", v, "-", None)
        });
    }
    Ok(rows)
}

/// One agent's first sync of `n` rollouts in a namespace of its own, then `pushes` pushes.
async fn linnet_sitting(
    cfg: &Config,
    admin: &Client,
    n: usize,
    pushes: usize,
) -> Result<Sitting, String> {
    let ns = support::TestNamespace::create(admin, &format!("bench-sitting-{n}")).await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let host = git_host(cfg, tmp.path(), &ns.name, n, &base);
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let slow = Duration::from_secs(60 + n as u64 / 2);
    let started = Instant::now();
    let apiserver_before = apiserver_cpu();
    let agent = start_agent(cfg, tmp.path(), &host.url, &ns.name, port, ("1h", "1h"));
    let stable_set = |o: &StatefulSet| {
        o.metadata
            .name
            .as_deref()
            .is_some_and(|x| x.ends_with("-stable"))
    };
    let (crs, created, ready, stable) = tokio::join!(
        count_seen(rollouts.clone(), n, slow * 3, |_| true),
        count_seen(sets.clone(), n, slow * 3, stable_set),
        count_seen(sets.clone(), n, slow * 3, move |o: &StatefulSet| {
            stable_set(o) && o.status.as_ref().and_then(|st| st.ready_replicas) == Some(1)
        }),
        count_seen(rollouts.clone(), n, slow * 3, |o| {
            phase(o) == Some(StatefulSetPhase::Stable)
        }),
    );
    let since = |at: Instant| (at - started).as_secs_f64();
    let (crs_s, created_s, ready_s, stable_s) =
        (since(crs?), since(created?), since(ready?), since(stable?));
    // Both share the two cores with the StatefulSet controller's pods: said per sitting.
    log(&format!(
        "size {n}: linnet sitting: agent CPU {:.1} s, kube-apiserver CPU {:.1} s until every rollout was Stable",
        usage(agent.pid()).1,
        apiserver_cpu() - apiserver_before
    ));
    let template = sets
        .get(&format!("{}-stable", rollout_name(0)))
        .await
        .map_err(|e| e.to_string())?;
    settle(&agent, Duration::from_secs(3), slow).await;
    let reader = fetch::Reader::clone(&host.url, GIT_TOKEN, tmp.path());
    let mut fetched = Vec::new();
    for k in 0..pushes {
        let name = rollout_name(k % n);
        let image = format!("bench:s{k}");
        let file = host.work.join(spec_file(cfg, k % n));
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        let old = text
            .lines()
            .find(|l| l.starts_with("  image: "))
            .unwrap_or_default()
            .to_string();
        std::fs::write(&file, text.replacen(&old, &format!("  image: {image}"), 1))
            .map_err(|e| e.to_string())?;
        let want = image.clone();
        let written =
            support::first_seen(rollouts.clone(), support::watch_named(&name), move |o| {
                o.spec.image == want
            })
            .await;
        push(&host.work, &format!("{name} {image}"));
        tokio::time::timeout(Duration::from_secs(30), written)
            .await
            .map_err(|_| format!("sitting push {k}: {name} never got {image}"))?
            .map_err(|e| e.to_string())?;
        fetched.push((git(&host.work, &["rev-parse", "HEAD"]), reader.fetch_ms()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (read_ms, fetch_ms) = fetch::paired(&host.bare, &tmp.path().join("agent.log"), &fetched);
    drop(agent);
    // LINNET_BENCH_KEEP_LOGS=<dir> keeps each sitting's agent log there, to read its timeline.
    if let Ok(dir) = std::env::var("LINNET_BENCH_KEEP_LOGS") {
        let kept = Path::new(&dir).join(format!("sitting-{n}-{}.log", ns.name));
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::copy(tmp.path().join("agent.log"), kept);
    }
    deleted(admin, ns).await;
    Ok(Sitting {
        stable_s,
        crs_s,
        created_s,
        ready_s,
        template,
        read_ms,
        fetch_ms,
    })
}
