//! Handler state without statics: values registered by type ([`Runtime::state`](super::Runtime::state),
//! [`ConsumerBuilder::state`](super::ConsumerBuilder::state)) and handed to handlers that take a
//! [`State<T>`] argument (axum's extractor, for one type per argument).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use crate::consumer::BoxedHandler;

/// A handler's second argument: a clone of the value of type `T` registered with
/// [`Runtime::state`](super::Runtime::state) or the listener's [`ConsumerBuilder::state`](super::ConsumerBuilder::state).
/// Put what handlers share (a pool, a client, counters) behind an `Arc` in `T`, so the clone is cheap.
///
/// ```no_run
/// # use stream_listener::{stream_listener, Message, State};
/// #[derive(Clone)]
/// struct Db { /* a pool */ }
///
/// #[stream_listener(stream = "orders", group = "billing")]
/// async fn on_order(msg: Message<serde_json::Value>, State(db): State<Db>) -> Result<(), String> {
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct State<T>(pub T);

/// Values registered by type. A listener's own values come before the runtime's.
#[derive(Clone, Default)]
pub struct States {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for States {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("States")
            .field("types", &self.values.len())
            .finish()
    }
}

/// A handler asks for a state of a type nobody registered.
#[derive(Clone, PartialEq, Eq, thiserror::Error, stream_listener_macros::ReportDebug)]
#[error("the handler takes `State<{type_name}>` but no value of that type was registered: call `Runtime::state(..)` or `ConsumerBuilder::state(..)` with one")]
pub struct MissingState {
    /// The state type the handler asks for.
    pub type_name: &'static str,
}

impl States {
    /// Registers `value`, replacing an earlier value of the same type.
    pub(crate) fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// A clone of the value of type `T`.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Result<State<T>, MissingState> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|value| value.downcast_ref::<T>())
            .map(|value| State(value.clone()))
            .ok_or(MissingState {
                type_name: std::any::type_name::<T>(),
            })
    }

    /// `self`'s values over `fallback`'s.
    pub(crate) fn over(&self, fallback: &States) -> States {
        let mut merged = fallback.clone();
        merged
            .values
            .extend(self.values.iter().map(|(k, v)| (*k, v.clone())));
        merged
    }
}

/// Builds a handler once the states are known (at start).
pub(crate) type Bind = Arc<dyn Fn(&States) -> Result<BoxedHandler, MissingState> + Send + Sync>;

/// A listener's handler: ready, or waiting for its states.
#[derive(Clone)]
pub(crate) enum HandlerSource {
    Ready(BoxedHandler),
    Bind(Bind),
}

impl std::fmt::Debug for HandlerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ready(_) => "Ready",
            Self::Bind(_) => "Bind",
        })
    }
}

impl HandlerSource {
    pub(crate) fn bind(&self, states: &States) -> Result<BoxedHandler, MissingState> {
        match self {
            Self::Ready(handler) => Ok(handler.clone()),
            Self::Bind(bind) => bind(states),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_value_wins_and_a_missing_type_is_named() {
        let mut runtime = States::default();
        runtime.insert(1u32);
        runtime.insert(String::from("runtime"));
        let mut listener = States::default();
        listener.insert(String::from("listener"));
        let merged = listener.over(&runtime);
        assert_eq!(merged.get::<String>().unwrap().0, "listener");
        assert_eq!(merged.get::<u32>().unwrap().0, 1);
        assert_eq!(
            merged.get::<u64>().unwrap_err(),
            MissingState { type_name: "u64" }
        );
    }
}
