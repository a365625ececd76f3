//! Events about this node, as upstream posts them (`events.k8s.io/v1`, regarding the Node,
//! in the `default` namespace): that the proxy started, and what serves the mode asked for.
//! Best effort: a failure is logged, never fatal.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;

/// What to say.
pub struct Note<'a> {
    pub warning: bool,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
}

pub async fn post(client: &kube::Client, node_name: &str, note: Note<'_>) {
    let now = jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{node_name}.{:x}", now.as_nanosecond())),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(note.action.into()),
        reason: Some(note.reason.into()),
        note: Some(note.note.chars().take(1024).collect()),
        type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
        reporting_controller: Some("kube-proxy".into()),
        reporting_instance: Some(format!("kube-proxy-{node_name}")),
        regarding: Some(ObjectReference {
            kind: Some("Node".into()),
            name: Some(node_name.into()),
            uid: Some(node_name.into()),
            api_version: Some("v1".into()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(error = %e, reason = note.reason, "Failed to post an event");
    }
}
