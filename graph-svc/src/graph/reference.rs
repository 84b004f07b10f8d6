//! The walk as first written (hash map of touched nodes, hub rows searched
//! per touched node, two passes per push): the reference the optimised
//! [`Graph::ppr`] must reproduce exactly.

use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

use super::*;

impl Graph {
    pub(crate) fn ppr_reference(
        &self,
        seeds: &[(u32, f64)],
        view: &View,
        p: &PprParams,
    ) -> PprOutcome {
        let mut local: HashMap<u32, u32> = HashMap::new();
        let mut nodes: Vec<u32> = Vec::new();
        let mut hop: Vec<u8> = Vec::new();
        let mut resid: Vec<f64> = Vec::new();
        let mut vdeg: Vec<f64> = Vec::new();
        let mut seed_mass: Vec<f64> = Vec::new();
        let mut mem_count = 0usize;
        let mut ent_count = 0usize;
        let mem_cap = p.max_nodes;
        let ent_cap = match p.budget {
            NodeBudget::AllNodes => p.max_nodes,
            NodeBudget::MemoryNodes => p.max_nodes.saturating_mul(ENTITY_FACTOR),
        };
        let fits = |mem_count: usize, ent_count: usize, add_m: usize, add_e: usize| match p.budget {
            NodeBudget::AllNodes => mem_count + ent_count + add_m + add_e <= p.max_nodes,
            NodeBudget::MemoryNodes => mem_count + add_m <= mem_cap && ent_count + add_e <= ent_cap,
        };
        let total_seed: f64 = seeds
            .iter()
            .filter(|s| self.node_visible(s.0, view) && (s.0 as usize) < self.wdeg.len())
            .map(|s| s.1.max(0.0))
            .sum();
        if total_seed <= 0.0 {
            return PprOutcome::default();
        }
        let mut deadline_hit = false;
        for &(n, w) in seeds {
            if w <= 0.0 || !self.node_visible(n, view) || (n as usize) >= self.wdeg.len() {
                continue;
            }
            let li = match local.get(&n) {
                Some(&li) => li,
                None => {
                    let is_mem = self.is_memory_node(n);
                    if !fits(
                        mem_count,
                        ent_count,
                        usize::from(is_mem),
                        usize::from(!is_mem),
                    ) {
                        continue;
                    }
                    if is_mem {
                        mem_count += 1;
                    } else {
                        ent_count += 1;
                    }
                    let li = nodes.len() as u32;
                    local.insert(n, li);
                    nodes.push(n);
                    hop.push(0);
                    resid.push(0.0);
                    vdeg.push(f64::NAN);
                    seed_mass.push(0.0);
                    li
                }
            };
            resid[li as usize] += w / total_seed;
            seed_mass[li as usize] += w / total_seed;
        }
        if nodes.is_empty() {
            return PprOutcome::default();
        }
        let d = p.damping;
        let eps = p.tol.max(1e-12);
        let mut heap: BinaryHeap<(Pri, u32)> = BinaryHeap::new();
        for li in 0..nodes.len() {
            heap.push((Pri(f64::INFINITY), li as u32));
        }
        let max_pushes = (p.max_iter as usize).max(1) * p.max_nodes.max(1);
        let max_scans = 4_000_000usize;
        let (mut pushes, mut scans) = (0usize, 0usize);
        let mut new_nbrs: Vec<u32> = Vec::new();
        while let Some((_, li)) = heap.pop() {
            let u = nodes[li as usize];
            let r = resid[li as usize];
            // Thresholds on the degree the caller sees: the full degree
            // would let hidden edges decide which nodes a walk touches.
            let seen_deg = self.visible_degree(u, view).max(1e-12);
            // Seeds always spread once, whatever their degree.
            if r <= eps * seen_deg && !(hop[li as usize] == 0 && vdeg[li as usize].is_nan())
                || r <= 0.0
            {
                continue;
            }
            if pushes >= max_pushes || scans >= max_scans {
                break;
            }
            if pushes % 32 == 0 && p.deadline_opt.is_some_and(|dl| Instant::now() >= dl) {
                deadline_hit = true;
                break;
            }
            pushes += 1;
            if vdeg[li as usize].is_nan() {
                vdeg[li as usize] = self.visible_degree(u, view);
            }
            let deg = vdeg[li as usize];
            resid[li as usize] = 0.0;
            if deg <= 0.0 {
                continue;
            }
            let spread = d * r;
            let range = self.edges(u);
            scans += range.len();
            // New neighbours first, to decide whether this push may admit.
            new_nbrs.clear();
            let can_grow = hop[li as usize] < p.max_hops;
            if can_grow {
                for e in range.clone() {
                    let v = self.targets[e];
                    if !local.contains_key(&v) && self.edge_visible(e, view) {
                        new_nbrs.push(v);
                    }
                }
                new_nbrs.dedup();
            }
            let mut add_m = new_nbrs.iter().filter(|&&v| self.is_memory_node(v)).count();
            let mut add_e = new_nbrs.len() - add_m;
            let mut admit = can_grow && fits(mem_count, ent_count, add_m, add_e);
            if can_grow && !admit && hop[li as usize] == 0 {
                // A seed hub: its heaviest neighbours still deserve a look,
                // within half of what the budget has left.
                let left = match p.budget {
                    NodeBudget::AllNodes => p.max_nodes.saturating_sub(mem_count + ent_count),
                    NodeBudget::MemoryNodes => mem_cap
                        .saturating_sub(mem_count)
                        .min(ent_cap.saturating_sub(ent_count)),
                };
                // The first visible edge to the neighbour carries its weight.
                let weight_of = |v: u32| {
                    let row = &self.targets[range.clone()];
                    let at = range.start + row.partition_point(|&t| t < v);
                    (at..range.end)
                        .take_while(|&e| self.targets[e] == v)
                        .find(|&e| self.edge_visible(e, view))
                        .map_or(0.0, |e| self.weights[e])
                };
                new_nbrs.sort_by(|&a, &b| weight_of(b).total_cmp(&weight_of(a)).then(a.cmp(&b)));
                new_nbrs.truncate(left / 2);
                add_m = new_nbrs.iter().filter(|&&v| self.is_memory_node(v)).count();
                add_e = new_nbrs.len() - add_m;
                admit = !new_nbrs.is_empty();
            }
            if admit {
                for &v in &new_nbrs {
                    let lv = nodes.len() as u32;
                    local.insert(v, lv);
                    nodes.push(v);
                    hop.push(hop[li as usize] + 1);
                    resid.push(0.0);
                    vdeg.push(f64::NAN);
                    seed_mass.push(0.0);
                }
                mem_count += add_m;
                ent_count += add_e;
            }
            for e in range {
                let v = self.targets[e];
                let Some(&lv) = local.get(&v) else { continue };
                if !self.edge_visible(e, view) {
                    continue;
                }
                let share = spread * f64::from(self.weights[e]) / deg;
                resid[lv as usize] += share;
                let v_seen_deg = self.visible_degree(v, view).max(1e-12);
                if resid[lv as usize] > eps * v_seen_deg {
                    heap.push((Pri(resid[lv as usize] / v_seen_deg), lv));
                }
            }
        }
        let x = self.solve_local_reference(
            &nodes,
            &local,
            &mut vdeg,
            &seed_mass,
            view,
            p,
            &mut deadline_hit,
        );
        let mut mems: Vec<(u32, f64)> = (0..nodes.len())
            .filter(|&li| self.is_memory_node(nodes[li]) && x[li] > 0.0)
            .map(|li| (li as u32, x[li]))
            .collect();
        mems.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        mems.truncate(p.k);
        let hits = mems
            .iter()
            .map(|&(li, score)| {
                let m = nodes[li as usize];
                let mut via: Vec<(u32, f64)> = Vec::new();
                for e in self.edges(m) {
                    let v = self.targets[e];
                    if self.is_memory_node(v) || !self.edge_visible(e, view) {
                        continue;
                    }
                    if let Some(&lv) = local.get(&v) {
                        let deg = vdeg[lv as usize];
                        if deg > 0.0 {
                            via.push((
                                v - self.memory_ids.len() as u32,
                                x[lv as usize] * f64::from(self.weights[e]) / deg,
                            ));
                        }
                    }
                }
                via.sort_by(|a, b| b.1.total_cmp(&a.1));
                via.dedup_by_key(|v| v.0);
                Hit {
                    memory: m,
                    score,
                    via_entities: via.into_iter().take(3).map(|v| v.0).collect(),
                }
            })
            .collect();
        PprOutcome {
            hits,
            nodes_touched: nodes.len(),
            memories_touched: mem_count,
            deadline_hit,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn solve_local_reference(
        &self,
        nodes: &[u32],
        local: &HashMap<u32, u32>,
        vdeg: &mut [f64],
        seed: &[f64],
        view: &View,
        p: &PprParams,
        deadline_hit: &mut bool,
    ) -> Vec<f64> {
        let n = nodes.len();
        // Local CSR of transition probabilities u -> v.
        let mut off = Vec::with_capacity(n + 1);
        let mut to: Vec<u32> = Vec::new();
        let mut prob: Vec<f64> = Vec::new();
        off.push(0usize);
        for (li, &u) in nodes.iter().enumerate() {
            if vdeg[li].is_nan() {
                vdeg[li] = self.visible_degree(u, view);
            }
            let deg = vdeg[li];
            if deg > 0.0 {
                let range = self.edges(u);
                if range.len() > 4 * n {
                    // A hub: look each touched node up in its sorted row.
                    let row = &self.targets[range.clone()];
                    for (lv, &v) in nodes.iter().enumerate() {
                        let lo = row.partition_point(|&t| t < v);
                        let hi = row.partition_point(|&t| t <= v);
                        for e in range.start + lo..range.start + hi {
                            if self.edge_visible(e, view) {
                                to.push(lv as u32);
                                prob.push(f64::from(self.weights[e]) / deg);
                            }
                        }
                    }
                } else {
                    for e in range {
                        if let Some(&lv) = local.get(&self.targets[e])
                            && self.edge_visible(e, view)
                        {
                            to.push(lv);
                            prob.push(f64::from(self.weights[e]) / deg);
                        }
                    }
                }
            }
            off.push(to.len());
        }
        let d = p.damping;
        let mut x = seed.to_vec();
        let mut next = vec![0f64; n];
        for _ in 0..p.max_iter.max(1) {
            for (v, s) in next.iter_mut().zip(seed) {
                *v = (1.0 - d) * s;
            }
            for u in 0..n {
                let xu = x[u];
                if xu == 0.0 {
                    continue;
                }
                for e in off[u]..off[u + 1] {
                    next[to[e] as usize] += d * xu * prob[e];
                }
            }
            let delta: f64 = x.iter().zip(&next).map(|(a, b)| (a - b).abs()).sum();
            std::mem::swap(&mut x, &mut next);
            if delta < p.tol {
                break;
            }
            if p.deadline_opt.is_some_and(|dl| Instant::now() >= dl) {
                *deadline_hit = true;
                break;
            }
        }
        x
    }
}
