//! Planning: every listener's spec becomes one [`MemberPlan`] per member, with its final consumer
//! configuration and its handler bound to its states. Pure: the specs and the environment's overrides
//! are arguments, nothing here touches Redis.

use std::collections::HashMap;
use std::time::Duration;

use crate::consumer::{BoxedHandler, ConsumerConfig, LifecycleHooks};
use crate::topology::StartFrom;

use super::spec::{ListenerSpec, Origin};
use super::{Runtime, RuntimeError};

/// Everything needed to start one logical member.
#[derive(Debug, Clone)]
pub(super) struct MemberPlan {
    pub(super) label: String,
    /// Where the listener was declared, for errors.
    pub(super) origin: String,
    pub(super) member_id: String,
    pub(super) weight: u32,
    /// The member's consumer, as it runs.
    pub(super) consumer: ConsumerConfig,
    pub(super) handler: BoxedHandler,
    pub(super) start_from: StartFrom,
    pub(super) shard_count: Option<u32>,
    pub(super) hooks: LifecycleHooks,
    /// Static membership: a shutdown announces a restart under the same member id.
    pub(super) restarts: bool,
}

/// The plans of `specs` under `runtime`'s settings: each spec gets its hooks from the runtime, the
/// overrides `env` finds (if the runtime applies them), is validated and bound to its states; then one plan
/// per member. Refuses no listener at all, and two plans of the same member of a group.
pub(super) fn plans(
    runtime: &Runtime,
    mut specs: Vec<ListenerSpec>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<MemberPlan>, RuntimeError> {
    for (name, hooks) in &runtime.hooks {
        let mut found = false;
        for spec in specs.iter_mut().filter(|spec| &spec.name == name) {
            spec.hooks = hooks.clone();
            found = true;
        }
        if !found {
            return Err(RuntimeError::HooksForUnknownListener {
                name: name.clone(),
                known: specs.iter().map(|spec| spec.name.clone()).collect(),
            });
        }
    }
    // Entries a member's earlier incarnation (or a dead member) read and never acknowledged are claimed
    // once they have been idle for a session timeout: by then their reader's lease is over.
    let reclaim_idle = Duration::from_millis(runtime.group_config.session_timeout_ms.max(1) as u64);
    // Static membership: the base must name this process after a restart too.
    let stable = runtime.static_membership.then(|| {
        crate::member::identity::stable_base_member_id(runtime.base_member_id.as_deref(), &env)
            .map(|base| base.id)
    });
    let mut plans = Vec::new();
    for mut spec in specs {
        if runtime.env_overrides {
            spec.apply_env(&env)?;
        }
        spec.validate()?;
        let origin = spec.origin.to_string();
        let states = spec.states.over(&runtime.states);
        let handler = spec
            .handler
            .as_ref()
            .expect("validated: a handler is set")
            .bind(&states)
            .map_err(|missing| RuntimeError::MissingState {
                listener: origin.clone(),
                missing,
            })?;
        let label = match &spec.origin {
            Origin::Annotated { path, .. } => path.clone(),
            Origin::Builder { .. } => format!("{}/{}", spec.stream, spec.group),
        };
        let base = match &stable {
            None => runtime.base_member_id.clone(),
            Some(Some(base)) => Some(base.clone()),
            Some(None) if spec.member_id.is_some() => None,
            Some(None) => return Err(RuntimeError::NoStableMemberId { listener: origin }),
        };
        for member_id in spec.member_ids(base.as_deref()) {
            let mut consumer = spec.consumer_config(&member_id);
            consumer.reclaim_idle = reclaim_idle;
            plans.push(MemberPlan {
                label: label.clone(),
                origin: origin.clone(),
                consumer,
                member_id,
                weight: spec.weight,
                handler: handler.clone(),
                start_from: spec.start_from,
                shard_count: spec.shard_count,
                hooks: spec.hooks.clone(),
                restarts: runtime.static_membership,
            });
        }
    }
    if plans.is_empty() {
        return Err(RuntimeError::NoListeners);
    }
    check_unique_members(&plans)?;
    Ok(plans)
}

/// Refuses two plans with the same member of the same group (they would fence each other forever).
fn check_unique_members(plans: &[MemberPlan]) -> Result<(), RuntimeError> {
    let mut seen: HashMap<(&str, &str, &str), &MemberPlan> = HashMap::new();
    for plan in plans {
        let key = (
            plan.consumer.stream_prefix.as_str(),
            plan.consumer.group.as_str(),
            plan.member_id.as_str(),
        );
        if let Some(first) = seen.insert(key, plan) {
            return Err(RuntimeError::DuplicateMemberId {
                member_id: plan.member_id.clone(),
                stream: plan.consumer.stream_prefix.clone(),
                group: plan.consumer.group.clone(),
                first: first.origin.clone(),
                second: plan.origin.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::RawMessage;
    use crate::coordinator::metadata::GroupConfig;
    use crate::runtime::ConsumerBuilder;

    fn builder(group: &str) -> ConsumerBuilder {
        ConsumerBuilder::new("orders", group)
            .member_id("solo")
            .handler(|_m: RawMessage| async { Ok::<(), String>(()) })
    }

    fn specs(runtime: &Runtime) -> Vec<ListenerSpec> {
        runtime
            .builders
            .iter()
            .enumerate()
            .map(|(index, builder)| builder.clone().into_spec(index + 1))
            .collect()
    }

    #[test]
    fn a_plan_carries_the_final_consumer_config() {
        let runtime = Runtime::new("redis://127.0.0.1:1")
            .without_annotated_listeners()
            .group_config(GroupConfig {
                session_timeout_ms: 7_000,
                ..GroupConfig::default()
            })
            .consumer(builder("billing").batch_size(7));
        let plans = plans(&runtime, specs(&runtime), |_| None).unwrap();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].member_id, "solo");
        assert_eq!(plans[0].consumer.batch_size, 7);
        assert_eq!(plans[0].consumer.reclaim_idle, Duration::from_secs(7));
    }

    #[test]
    fn the_environment_overrides_a_listener_unless_the_runtime_ignores_it() {
        let env =
            |name: &str| (name == "STREAM_LISTENER_ORDERS_BILLING_BATCH_SIZE").then(|| "9".into());
        let runtime = Runtime::new("redis://127.0.0.1:1").consumer(builder("billing"));
        assert_eq!(
            plans(&runtime, specs(&runtime), env).unwrap()[0]
                .consumer
                .batch_size,
            9
        );
        let runtime = runtime.without_env_overrides();
        assert_ne!(
            plans(&runtime, specs(&runtime), env).unwrap()[0]
                .consumer
                .batch_size,
            9
        );
    }

    #[test]
    fn no_listener_and_one_member_twice_are_refused() {
        let runtime = Runtime::new("redis://127.0.0.1:1");
        assert!(matches!(
            plans(&runtime, Vec::new(), |_| None),
            Err(RuntimeError::NoListeners)
        ));
        let runtime = runtime
            .consumer(builder("billing"))
            .consumer(builder("billing"));
        assert!(matches!(
            plans(&runtime, specs(&runtime), |_| None),
            Err(RuntimeError::DuplicateMemberId { member_id, .. }) if member_id == "solo"
        ));
        let runtime = Runtime::new("redis://127.0.0.1:1")
            .consumer(builder("billing"))
            .consumer(builder("audit"));
        assert_eq!(plans(&runtime, specs(&runtime), |_| None).unwrap().len(), 2);
    }

    #[test]
    fn static_membership_names_members_by_what_survives_a_restart_or_refuses_to_start() {
        let unnamed = || {
            ConsumerBuilder::new("orders", "billing")
                .handler(|_m: RawMessage| async { Ok::<(), String>(()) })
        };
        let runtime = Runtime::new("redis://127.0.0.1:1")
            .without_annotated_listeners()
            .static_membership()
            .consumer(unnamed());
        let pod = |name: &str| match name {
            "POD_NAME" => Some("orders-2".to_string()),
            "POD_IP" => Some("10.0.0.7".to_string()),
            _ => None,
        };
        let plan = &plans(&runtime, specs(&runtime), pod).unwrap()[0];
        assert_eq!(plan.member_id, "orders-2-billing");
        assert!(plan.restarts);
        // Only an IP (it changes on every restart): refused, naming the listener.
        let ip = |name: &str| (name == "POD_IP").then(|| "10.0.0.7".to_string());
        assert!(matches!(
            plans(&runtime, specs(&runtime), ip),
            Err(RuntimeError::NoStableMemberId { listener }) if listener.contains("orders")
        ));
        // A listener with its own id needs nothing else.
        let runtime = Runtime::new("redis://127.0.0.1:1")
            .without_annotated_listeners()
            .static_membership()
            .consumer(builder("billing"));
        let plan = &plans(&runtime, specs(&runtime), ip).unwrap()[0];
        assert_eq!(plan.member_id, "solo");
        assert!(plan.restarts);
        // Off by default: the pod IP, and a shutdown is a plain leave.
        let runtime = Runtime::new("redis://127.0.0.1:1")
            .without_annotated_listeners()
            .consumer(unnamed());
        let plan = &plans(&runtime, specs(&runtime), pod).unwrap()[0];
        assert!(!plan.restarts);
    }
}
