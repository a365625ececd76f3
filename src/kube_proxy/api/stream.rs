//! A watch whose initial list (and every relist after the watch expired) arrives as watch
//! events (`sendInitialEvents`, the apiserver's streaming lists) rather than pages of a list.
//!
//! A paged list is one request per 500 objects, and each request waits for the client's
//! rate limit (`--kube-api-qps` 5, burst 10): 10,000 Services and their 10,000 slices are 40
//! pages, about 6 s of waiting before the first sync can start. Streamed, each kind is one
//! request, and objects are read and dropped one at a time instead of a page at a time. An
//! apiserver that refuses streaming lists (the WatchList feature turned off) gets the paged
//! list from then on.

use std::fmt::Debug;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

type Events<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

pub struct Watch<K: 'static> {
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    streaming: bool,
    events: Events<K>,
}

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    /// `config` as the paged list would use it; the streamed list is tried first.
    pub fn new(api: Api<K>, config: watcher::Config, kind: &'static str) -> Watch<K> {
        let events = open(&api, config.clone().streaming_lists());
        Watch {
            api,
            config,
            kind,
            streaming: true,
            events,
        }
    }

    /// Whether the initial lists are streamed (false once the apiserver refused that).
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// The next event (errors included: the watcher retries them with back-off), or `None`
    /// once `stop` is cancelled.
    pub async fn next(
        &mut self,
        stop: &CancellationToken,
    ) -> Option<Result<Event<K>, watcher::Error>> {
        let item = tokio::select! {
            _ = stop.cancelled() => None,
            item = self.events.next() => item,
        }?;
        if self.streaming {
            if let Err(e) = &item {
                if refuses_streaming(e) {
                    tracing::warn!(kind = self.kind, error = %e, "The apiserver does not stream initial lists; listing in pages");
                    self.streaming = false;
                    self.events = open(&self.api, self.config.clone());
                }
            }
        }
        Some(item)
    }
}

fn open<K>(api: &Api<K>, config: watcher::Config) -> Events<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api.clone(), config)
        .default_backoff()
        .boxed()
}

/// Whether `error` is an apiserver refusing `sendInitialEvents` (a request it calls invalid
/// or bad), not one that is away or slow.
pub fn refuses_streaming(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    matches!(status.code, 400 | 422)
}

#[cfg(test)]
mod tests;
