//! A full sync's reading of the cluster: one labelled list per kind this source may have
//! objects of (as the source's account where only it may list), one list per kind and
//! namespace where many desired objects are not labelled yet, and a read of each desired
//! object none of these found.

use super::*;

impl Syncer {
    /// One labelled list per kind finds everything this source manages: the common kinds,
    /// Git's, and every kind the inventory holds (a Role Git no longer declares). Returns the
    /// kinds listed in full (whose inventory entries not seen are gone).
    pub(super) async fn list_managed(
        &self,
        desired: &[DesiredObject],
        prune: &Prune<'_>,
        previous: Option<&BTreeMap<ObjectKey, String>>,
        by_key: &HashMap<&ObjectKey, &DesiredObject>,
        read: &mut LiveRead,
    ) -> BTreeSet<(String, String)> {
        let mut kinds: Vec<(String, String)> = PRUNABLE_KINDS
            .iter()
            .map(|(a, k)| (a.to_string(), k.to_string()))
            .collect();
        for key in desired.iter().map(|d| &d.key).chain(prune.applied.keys()) {
            let k = (key.api_version.clone(), key.kind.clone());
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        let mut listed_in_full = BTreeSet::new();
        for (api_version, kind) in kinds {
            let Ok((ar, caps)) = self.resource(&api_version, &kind).await else {
                continue; // not served; desired objects of this kind report it below
            };
            // A cluster-scoped kind the policy refuses: nothing of it is applied or pruned
            // (its desired objects report the refusal below).
            if caps.scope == Scope::Cluster && self.policy.cluster_kind_refusal(&kind).is_some() {
                continue;
            }
            // After a full sync that succeeded, the rollouts are as fresh in the agent's watch
            // as in a list (`watched.rs`).
            if previous.is_some()
                && let Some(n) = self.keep_watched(
                    (&api_version, &kind),
                    by_key,
                    (&mut read.live, &mut read.unchanged),
                )
            {
                tracing::debug!(kind, rollouts = n, "read from the watch instead of a list");
                continue;
            }
            let kind_of = KindToList {
                ar: &ar,
                caps: &caps,
                declared: desired
                    .iter()
                    .any(|d| d.key.api_version == api_version && d.key.kind == kind),
            };
            if self
                .list_kind(&kind_of, desired, previous, by_key, read)
                .await
            {
                listed_in_full.insert((api_version, kind));
            }
        }
        listed_in_full
    }

    /// Lists one kind where this source may have objects of it; `true` when it was listed
    /// everywhere without an error.
    async fn list_kind(
        &self,
        kind_of: &KindToList<'_>,
        desired: &[DesiredObject],
        previous: Option<&BTreeMap<ObjectKey, String>>,
        by_key: &HashMap<&ObjectKey, &DesiredObject>,
        read: &mut LiveRead,
    ) -> bool {
        let (ar, caps) = (kind_of.ar, kind_of.caps);
        let namespaces: Vec<&str> = if self.namespaces.is_empty() || caps.scope == Scope::Cluster {
            vec![""]
        } else {
            self.namespaces.iter().map(String::as_str).collect()
        };
        let params = ListParams::default().labels(&self.selector());
        let errors_before = read.errors.len();
        let mut in_full = true;
        for ns in namespaces {
            let api = self.api(ar, caps, ns);
            let listed = list_live(
                &api,
                &params,
                ar,
                by_key,
                false,
                (&mut read.live, &mut read.unchanged),
            )
            .await;
            match listed {
                Ok(()) => {}
                // A kind only the source may read (e.g. Secrets): its account lists it where
                // Git has it and where this source applied it before.
                Err(kube::Error::Api(s)) if s.code == 403 && self.apply_as != ApplyAs::Client => {
                    let source_namespaces: BTreeSet<&str> = if ns.is_empty() {
                        desired
                            .iter()
                            .map(|d| &d.key)
                            .chain(previous.into_iter().flat_map(BTreeMap::keys))
                            .filter(|k| k.api_version == ar.api_version && k.kind == ar.kind)
                            .map(|k| k.namespace.as_str())
                            .collect()
                    } else {
                        [ns].into()
                    };
                    for source_ns in source_namespaces {
                        in_full &= self
                            .list_as_source(kind_of, source_ns, &params, by_key, read)
                            .await;
                    }
                }
                // A kind Git does not declare and linnet may not list cannot hold anything
                // linnet applied with its own identity.
                Err(kube::Error::Api(s)) if s.code == 403 && !kind_of.declared => {
                    in_full = false;
                    tracing::debug!(
                        kind = ar.kind,
                        "not allowed to list; nothing of this kind to prune"
                    );
                }
                Err(e) => read.errors.push((kind_of.list_key(ns), cannot_list(&e))),
            }
        }
        in_full && read.errors.len() == errors_before
    }

    /// Lists one kind in `ns` as the source's account; `false` when it may not list a kind
    /// Git does not declare (nothing of it to prune).
    async fn list_as_source(
        &self,
        kind_of: &KindToList<'_>,
        ns: &str,
        params: &ListParams,
        by_key: &HashMap<&ObjectKey, &DesiredObject>,
        read: &mut LiveRead,
    ) -> bool {
        let api = match self.writer_api(kind_of.ar, kind_of.caps, ns) {
            Ok(api) => api,
            Err(e) => {
                read.errors.push((kind_of.list_key(ns), e.to_string()));
                return true;
            }
        };
        let listed = list_live(
            &api,
            params,
            kind_of.ar,
            by_key,
            false,
            (&mut read.live, &mut read.unchanged),
        )
        .await;
        match listed {
            Ok(()) => true,
            Err(kube::Error::Api(s)) if s.code == 403 && !kind_of.declared => {
                tracing::debug!(
                    kind = kind_of.ar.kind,
                    namespace = ns,
                    "the source may not list; nothing of this kind to prune"
                );
                false
            }
            Err(e) => {
                read.errors.push((kind_of.list_key(ns), cannot_list(&e)));
                true
            }
        }
    }

    /// Desired objects that may exist without linnet's labels (adopted on first sync). Where
    /// many of one kind in one namespace are unlabelled, as in a first sync, one list of that
    /// kind finds them all; one get each made a first sync of 1,000 rollouts 1,000 requests
    /// longer. Returns the kinds and namespaces listed so.
    pub(super) async fn list_unlabelled(
        &self,
        desired: &[DesiredObject],
        by_key: &HashMap<&ObjectKey, &DesiredObject>,
        read: &mut LiveRead,
    ) -> BTreeSet<(String, String, String)> {
        let mut unlabelled: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for d in desired.iter().filter(|d| !read.live.contains_key(&d.key)) {
            let group = (
                d.key.api_version.as_str(),
                d.key.kind.as_str(),
                d.key.namespace.as_str(),
            );
            *unlabelled.entry(group).or_default() += 1;
        }
        let mut listed = BTreeSet::new();
        for ((api_version, kind, ns), count) in unlabelled {
            if count < ADOPT_BY_LIST {
                continue;
            }
            let Ok((ar, caps)) = self.resource(api_version, kind).await else {
                continue;
            };
            let api = self.api(&ar, &caps, ns);
            let everything = ListParams::default();
            let found = list_live(
                &api,
                &everything,
                &ar,
                by_key,
                true,
                (&mut read.live, &mut read.unchanged),
            )
            .await;
            match found {
                Ok(()) => {
                    listed.insert((api_version.to_string(), kind.to_string(), ns.to_string()));
                }
                // One get each, in `read_desired`.
                Err(e) => tracing::debug!(kind, namespace = ns, error = %e, "cannot list"),
            }
        }
        listed
    }

    /// Reads each desired object no list found, and keeps those the cluster serves and the
    /// policy allows where they are.
    pub(super) async fn read_desired(
        &self,
        desired: Vec<DesiredObject>,
        listed: &BTreeSet<(String, String, String)>,
        read: &mut LiveRead,
    ) -> Vec<DesiredObject> {
        let mut servable = Vec::new();
        for d in desired {
            match self.resource(&d.key.api_version, &d.key.kind).await {
                // The policy before any read: a kind the loader did not know to be
                // cluster-scoped (a CSIDriver written with a namespace) is refused here.
                Ok((_, caps)) if let Some(why) = self.scope_refusal(&d.key, &caps) => {
                    read.live.remove(&d.key);
                    read.errors.push((d.key.clone(), why));
                }
                Ok((ar, caps)) => {
                    let unread = !read.live.contains_key(&d.key)
                        && !listed.contains(&(
                            d.key.api_version.clone(),
                            d.key.kind.clone(),
                            d.key.namespace.clone(),
                        ));
                    if unread {
                        match self.get_live(&ar, &caps, &d.key).await {
                            Ok(Some(object)) => {
                                read.live.insert(d.key.clone(), to_value(object, &ar));
                            }
                            Ok(None) => {}
                            Err(e) => {
                                read.errors.push((d.key.clone(), e.to_string()));
                                continue;
                            }
                        }
                    }
                    servable.push(d);
                }
                Err(e) => read.errors.push((d.key.clone(), e.to_string())),
            }
        }
        servable
    }
}

/// What a full sync has read of the cluster so far.
#[derive(Default)]
pub(super) struct LiveRead {
    /// The live objects, as far as the diff looks at them.
    pub(super) live: BTreeMap<ObjectKey, Value>,
    /// Those seen to be as their desired objects want them.
    pub(super) unchanged: BTreeSet<ObjectKey>,
    pub(super) errors: Vec<(ObjectKey, String)>,
}

/// A kind listed for a full sync, and whether Git declares any object of it.
struct KindToList<'a> {
    ar: &'a ApiResource,
    caps: &'a ApiCapabilities,
    declared: bool,
}

impl KindToList<'_> {
    /// Where an error listing it in `ns` is reported.
    fn list_key(&self, ns: &str) -> ObjectKey {
        ObjectKey::new(
            self.ar.api_version.clone(),
            self.ar.kind.clone(),
            ns.to_string(),
            "*",
        )
    }
}

fn cannot_list(e: &kube::Error) -> String {
    format!(
        "cannot list: {}",
        kube_message_hinted(e, READ_FORBIDDEN_HINT)
    )
}
