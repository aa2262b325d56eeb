//! Kinds the agent reads from Git and never applies: a `Fleet` (issue 73, read by agents
//! given `--fleet`) and an `ImagePolicy` (issue 74, read by agents given
//! `--image-automation`). The loader checks each as the agent reads it, so that `linnet
//! validate` names a problem at its `file:line:column`, and leaves it out of the apply.

use super::place::{Loaded, Place};
use super::*;

/// `Some` for a Fleet or an ImagePolicy: left out, or its problems.
pub(super) fn left_out(
    place: &Place<'_>,
    map: &serde_json::Map<String, Value>,
) -> Option<std::result::Result<Loaded, Vec<SpecError>>> {
    let field = |k: &str| map.get(k).and_then(Value::as_str).unwrap_or_default();
    let group = field("apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    let kind = field("kind");
    if group != crate::api::GROUP
        || (kind != crate::api::FLEET_KIND && kind != crate::api::IMAGE_POLICY_KIND)
    {
        return None;
    }
    if field("apiVersion") != API_VERSION {
        let message = format!(
            "unsupported apiVersion {:?}; expected {API_VERSION:?}",
            field("apiVersion")
        );
        return Some(Err(vec![place.key(&["apiVersion"], message)]));
    }
    Some(if kind == crate::api::FLEET_KIND {
        fleet(place)
    } else {
        image_policy(place)
    })
}

fn fleet(place: &Place<'_>) -> std::result::Result<Loaded, Vec<SpecError>> {
    let options = crate::specs::bounded_parser_options();
    let fleet: crate::api::Fleet = serde_saphyr::from_str_with_options(&place.doc.text, options)
        .map_err(|e| vec![yaml_error(place.file, place.doc, &e, "Fleet: ")])?;
    let problems: Vec<SpecError> = fleet
        .spec
        .problems()
        .into_iter()
        .map(|(path, message)| {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            place.key(&path, message)
        })
        .collect();
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Loaded::LeftOut(place.start(format!(
        "Fleet {} is read from Git by the agents given --fleet {}, never applied",
        fleet.metadata.name, place.file
    ))))
}

fn image_policy(place: &Place<'_>) -> std::result::Result<Loaded, Vec<SpecError>> {
    let options = crate::specs::bounded_parser_options();
    let policy: crate::api::ImagePolicy =
        serde_saphyr::from_str_with_options(&place.doc.text, options)
            .map_err(|e| vec![yaml_error(place.file, place.doc, &e, "ImagePolicy: ")])?;
    if let Err(e) = crate::plan::image_tags::TagPolicy::new(&policy.spec) {
        return Err(vec![place.key(e.field(), e.to_string())]);
    }
    if crate::plan::image_tags::registry_and_path(&policy.spec.image).is_none() {
        let message = format!(
            "image {:?} is not a repository name (registry/path, no tag or digest)",
            policy.spec.image
        );
        return Err(vec![place.key(&["spec", "image"], message)]);
    }
    Ok(Loaded::LeftOut(place.start(format!(
        "ImagePolicy {} is read from Git by agents given --image-automation, never applied",
        policy.metadata.name
    ))))
}
