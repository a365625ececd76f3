//! Agent selection: one storage per configured strategy, consulted in `--proxy-strategies`
//! order, with upstream's keys, ordering and draining rules.

use std::collections::HashMap;
use std::sync::Arc;

use super::session::AgentSession;
use crate::config::Strategy;

/// Agents indexed by the keys one strategy uses.
pub struct Storage {
    pub strategy: Strategy,
    /// Keys in insertion order; removal swaps the last key into the hole, as upstream.
    keys: Vec<String>,
    agents: HashMap<String, Vec<Arc<AgentSession>>>,
}

fn is(agent: &AgentSession, other: Option<&AgentSession>) -> bool {
    other.is_some_and(|o| std::ptr::eq(agent, o))
}

impl Storage {
    pub fn new(strategy: Strategy) -> Storage {
        Storage {
            strategy,
            keys: Vec::new(),
            agents: HashMap::new(),
        }
    }

    fn keys_for(&self, agent: &AgentSession) -> Vec<String> {
        match self.strategy {
            Strategy::Default => vec![agent.agent_id.clone()],
            Strategy::DefaultRoute if agent.identifiers.default_route => {
                vec![agent.agent_id.clone()]
            }
            Strategy::DefaultRoute => vec![],
            Strategy::DestHost => agent.identifiers.dest_host_keys(),
        }
    }

    pub fn add(&mut self, agent: &Arc<AgentSession>) {
        for key in self.keys_for(agent) {
            let list = self.agents.entry(key.clone()).or_default();
            if list.is_empty() {
                self.keys.push(key);
            }
            if !list.iter().any(|a| Arc::ptr_eq(a, agent)) {
                list.push(agent.clone());
            }
        }
    }

    pub fn remove(&mut self, agent: &Arc<AgentSession>) {
        for key in self.keys_for(agent) {
            let Some(list) = self.agents.get_mut(&key) else {
                continue;
            };
            list.retain(|a| !Arc::ptr_eq(a, agent));
            if list.is_empty() {
                self.agents.remove(&key);
                if let Some(i) = self.keys.iter().position(|k| *k == key) {
                    self.keys.swap_remove(i);
                }
            }
        }
    }

    /// Distinct keys: what readiness and `ready_backends` count.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Picks an agent for a dial to `dest_host` (the address without its port). With
    /// `instead_of`, only another agent that is neither draining nor suspect (a dial's second
    /// try); without, a draining or suspect one when no other is left.
    pub fn pick(
        &self,
        dest_host: &str,
        instead_of: Option<&AgentSession>,
    ) -> Option<Arc<AgentSession>> {
        match self.strategy {
            Strategy::DestHost => {
                let list = self.agents.get(dest_host)?;
                let fallback = if instead_of.is_some() {
                    None
                } else {
                    list.first()
                };
                list.iter()
                    .find(|a| !a.is_avoided() && !is(a, instead_of))
                    .or(fallback)
                    .cloned()
            }
            Strategy::Default | Strategy::DefaultRoute => self.pick_random(instead_of),
        }
    }

    /// The less loaded of two agents picked at random (the "power of two choices"): a hot
    /// agent stops taking most new tunnels while others idle, and no agent is chosen by
    /// scanning them all. Each of the two is the first agent neither draining nor suspect
    /// from a random starting key; a draining or suspect one only when every agent is (and
    /// never for a second try).
    fn pick_random(&self, instead_of: Option<&AgentSession>) -> Option<Arc<AgentSession>> {
        if self.keys.is_empty() {
            return None;
        }
        match self.scan(fastrand::usize(..self.keys.len()), instead_of, None) {
            Scan::Usable(first) => {
                let start = fastrand::usize(..self.keys.len());
                match self.scan(start, instead_of, Some(&first)) {
                    Scan::Usable(second) if second.load() < first.load() => Some(second),
                    _ => Some(first),
                }
            }
            Scan::OnlyAvoided(agent) if instead_of.is_none() => Some(agent),
            Scan::OnlyAvoided(_) | Scan::Nothing => None,
        }
    }

    /// From key `start` on, the first agent that is neither `instead_of` nor `other` and is
    /// not avoided; else the first avoided one met.
    fn scan(
        &self,
        start: usize,
        instead_of: Option<&AgentSession>,
        other: Option<&AgentSession>,
    ) -> Scan {
        let mut first_avoided = None;
        for i in 0..self.keys.len() {
            let key = &self.keys[(start + i) % self.keys.len()];
            let Some(agent) = self.agents.get(key).and_then(|l| l.first()) else {
                continue;
            };
            if is(agent, instead_of) || is(agent, other) {
                continue;
            }
            if !agent.is_avoided() {
                return Scan::Usable(agent.clone());
            }
            first_avoided.get_or_insert_with(|| agent.clone());
        }
        first_avoided.map_or(Scan::Nothing, Scan::OnlyAvoided)
    }
}

enum Scan {
    Usable(Arc<AgentSession>),
    OnlyAvoided(Arc<AgentSession>),
    Nothing,
}
