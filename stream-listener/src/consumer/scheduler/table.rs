//! The scheduler's maps (shards and jobs by id), in id order: a sorted array of ids beside an array of
//! their values.
//!
//! Every input of the scheduler looks shards up, often all of them; on an idle or lightly loaded member
//! each input finds the caches cold. A `BTreeMap` chased its nodes and compared keys one by one there:
//! the scheduler's answer to an idle wait's end took 13-20 us in the latency bench, on the path from the
//! reply to the handler. The ids here fit in a cache line or two and are searched by halving, and a
//! value is one index away. What moves the arrays is rare (an assignment, a revocation) or at their end
//! (a new job's id is the highest).

use std::ops::Index;

/// A map from id to `V`, ordered by id, with the subset of `BTreeMap`'s interface the scheduler uses.
#[derive(Debug, Clone)]
pub(crate) struct Table<K, V> {
    ids: Vec<K>,
    values: Vec<V>,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<K: Ord + Copy, V> Table<K, V> {
    fn position(&self, id: K) -> Result<usize, usize> {
        self.ids.binary_search(&id)
    }

    pub(crate) fn get(&self, id: &K) -> Option<&V> {
        let at = self.position(*id).ok()?;
        Some(&self.values[at])
    }

    pub(crate) fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        let at = self.position(*id).ok()?;
        Some(&mut self.values[at])
    }

    /// Puts `value` under `id`; gives back the value it replaces.
    pub(crate) fn insert(&mut self, id: K, value: V) -> Option<V> {
        match self.position(id) {
            Ok(at) => Some(std::mem::replace(&mut self.values[at], value)),
            Err(at) => {
                self.ids.insert(at, id);
                self.values.insert(at, value);
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, id: &K) -> Option<V> {
        let at = self.position(*id).ok()?;
        self.ids.remove(at);
        Some(self.values.remove(at))
    }

    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.values.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// `(id, state)` in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.ids.iter().zip(&self.values)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.ids.iter().zip(&mut self.values)
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.ids.iter()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.values.iter()
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.values.iter_mut()
    }
}

impl<K: Ord + Copy, V> Index<&K> for Table<K, V> {
    type Output = V;

    /// The value of `id`, which must be in the table.
    fn index(&self, id: &K) -> &V {
        self.get(id).expect("an id in the table")
    }
}

impl<'a, K, V> IntoIterator for &'a Table<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, K>, std::slice::Iter<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.ids.iter().zip(&self.values)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::Table;

    proptest! {
        /// Against `BTreeMap`, the map it stands in for: the same answers, in the same order, after any
        /// sequence of inserts and removes.
        #[test]
        fn rule_the_table_answers_as_an_ordered_map(ops in proptest::collection::vec((any::<bool>(), 0u32..40, any::<u8>()), 0..200)) {
            let (mut table, mut map) = (Table::default(), BTreeMap::new());
            for (insert, shard, value) in ops {
                if insert {
                    prop_assert_eq!(table.insert(shard, value), map.insert(shard, value));
                } else {
                    prop_assert_eq!(table.remove(&shard), map.remove(&shard));
                }
                prop_assert_eq!(table.get(&shard), map.get(&shard));
                prop_assert_eq!(table.len(), map.len());
                prop_assert!(table.keys().eq(map.keys()));
                prop_assert!(table.iter().eq(map.iter()));
            }
            if let Some((&first, &value)) = map.iter().next() {
                *table.get_mut(&first).expect("present") = value.wrapping_add(1);
                prop_assert_eq!(table[&first], value.wrapping_add(1));
            }
        }
    }
}
