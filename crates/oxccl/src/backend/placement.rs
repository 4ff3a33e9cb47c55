//! Which GPU each rank of a clique runs on, as a pure function of what
//! each rank asked for, where it runs and how many devices it sees, so
//! the rule is tested on machines of many GPUs without any.
//!
//! A rank that names a device (the C ABI: the device current in its
//! thread at init, as NCCL; a split or shrink child: its parent's) runs
//! there; several ranks may name one device. A rank that names none takes
//! device `local % visible`, `local` being its index among its host's
//! ranks, so a launcher's one process per GPU gets one GPU each.

use crate::error::{Error, Result};

/// One rank's request: its host's identity and the device it named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask<'a> {
    pub host: &'a str,
    pub device: Option<i32>,
}

/// Where a rank runs: its device, and how many ranks of its host share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub device: i32,
    pub sharing: u32,
}

/// Every rank's place, in rank order, on hosts that see `visible` devices
/// each. A named device outside `0..visible` is an error naming the rank.
pub fn place(asks: &[Ask<'_>], visible: i32) -> Result<Vec<Place>> {
    let visible = visible.max(1);
    let devices = asks
        .iter()
        .enumerate()
        .map(|(r, a)| match a.device {
            Some(d) if (0..visible).contains(&d) => Ok(d),
            Some(d) => Err(Error::InvalidUsage(format!(
                "rank {r} asked for device {d}, but its process sees devices 0..{visible} \
                 (CUDA_VISIBLE_DEVICES renumbers them from 0)"
            ))),
            None => {
                let local = asks[..r].iter().filter(|b| b.host == a.host).count() as i32;
                Ok(local % visible)
            }
        })
        .collect::<Result<Vec<i32>>>()?;
    Ok((0..asks.len())
        .map(|r| Place {
            device: devices[r],
            sharing: (0..asks.len())
                .filter(|&q| asks[q].host == asks[r].host && devices[q] == devices[r])
                .count() as u32,
        })
        .collect())
}

/// The places of a child clique (split, shrink, grow) whose rank `i` was
/// rank `members[i]` of a parent placed at `parent`: each keeps its
/// device, whatever its index in the child.
pub fn keep(parent: &[Place], hosts: &[&str], members: &[u32], visible: i32) -> Result<Vec<Place>> {
    let asks: Vec<Ask<'_>> = members
        .iter()
        .map(|&m| Ask {
            host: hosts[m as usize],
            device: Some(parent[m as usize].device),
        })
        .collect();
    place(&asks, visible)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks<'a>(host: &'a str, devs: &[Option<i32>]) -> Vec<Ask<'a>> {
        devs.iter().map(|&device| Ask { host, device }).collect()
    }

    fn devices(p: &[Place]) -> Vec<i32> {
        p.iter().map(|p| p.device).collect()
    }

    #[test]
    fn unnamed_ranks_go_round_robin_per_host() {
        let a = asks("h", &[None; 4]);
        assert_eq!(devices(&place(&a, 2).unwrap()), [0, 1, 0, 1]);
        assert!(place(&a, 2).unwrap().iter().all(|p| p.sharing == 2));
        let mut b = asks("a", &[None; 2]);
        b.extend(asks("b", &[None; 2]));
        assert_eq!(devices(&place(&b, 8).unwrap()), [0, 1, 0, 1]);
        assert!(place(&b, 8).unwrap().iter().all(|p| p.sharing == 1));
    }

    /// Ranks on GPUs 1, 3, 5, 7 of an 8-GPU host stay there, and so do
    /// the groups split from them (by index in the child they would land
    /// on 0 and 1).
    #[test]
    fn named_devices_are_kept_through_splits() {
        let a = asks("h", &[Some(1), Some(3), Some(5), Some(7)]);
        let p = place(&a, 8).unwrap();
        assert_eq!(devices(&p), [1, 3, 5, 7]);
        assert!(p.iter().all(|p| p.sharing == 1));
        let hosts = ["h"; 4];
        for members in [[0u32, 2], [1, 3], [3, 0]] {
            let child = keep(&p, &hosts, &members, 8).unwrap();
            let want: Vec<i32> = members.iter().map(|&m| p[m as usize].device).collect();
            assert_eq!(devices(&child), want, "{members:?}");
        }
    }

    /// A devlist in any order, naming a device several times (several
    /// ranks on one GPU stay allowed): each rank on its entry.
    #[test]
    fn devlist_orders_and_repeats() {
        let a = asks("h", &[Some(3), Some(0), Some(2), Some(0)]);
        let p = place(&a, 4).unwrap();
        assert_eq!(devices(&p), [3, 0, 2, 0]);
        assert_eq!(
            p.iter().map(|p| p.sharing).collect::<Vec<_>>(),
            [1, 2, 1, 2]
        );
        let a = asks("h", &[Some(0); 3]);
        assert_eq!(devices(&place(&a, 1).unwrap()), [0, 0, 0]);
    }

    /// Under CUDA_VISIBLE_DEVICES=5,7 a process sees devices 0 and 1: a
    /// rank naming 1 runs on physical GPU 7; one naming 5 is refused,
    /// naming the rank.
    #[test]
    fn visible_devices_are_renumbered() {
        let a = asks("h", &[Some(1), None]);
        assert_eq!(devices(&place(&a, 2).unwrap()), [1, 1]);
        let a = asks("h", &[None, Some(5)]);
        let e = place(&a, 2).unwrap_err().to_string();
        assert!(e.contains("rank 1 asked for device 5"), "{e}");
        let a = asks("h", &[Some(-1)]);
        assert!(place(&a, 2).is_err());
    }
}
