//! Which local address the bootstrap listens on: `NCCL_SOCKET_IFNAME` and
//! `NCCL_SOCKET_FAMILY`, with NCCL's defaults (InfiniBand interfaces
//! first, loopback last, container bridges never unless named).

use std::net::IpAddr;

use crate::env::BadVar;
use crate::error::BootstrapError;

/// An interface address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub addr: IpAddr,
}

/// `NCCL_SOCKET_FAMILY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Parsed `NCCL_SOCKET_IFNAME`: prefixes (or exact names with `=`), to
/// keep or (with `^`) to leave out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IfFilter {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfFilter {
    pub fn parse(s: &str) -> IfFilter {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        IfFilter {
            exclude,
            exact,
            names: s
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect(),
        }
    }

    fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Parses `NCCL_SOCKET_FAMILY` (`AF_INET`, `AF_INET6`; empty: either).
pub fn parse_family(s: &str) -> Result<Option<Family>, BootstrapError> {
    match s.trim().to_ascii_uppercase().as_str() {
        "" => Ok(None),
        "AF_INET" | "INET" | "4" | "IPV4" => Ok(Some(Family::V4)),
        "AF_INET6" | "INET6" | "6" | "IPV6" => Ok(Some(Family::V6)),
        _ => Err(BootstrapError::Config(BadVar {
            var: "NCCL_SOCKET_FAMILY",
            value: s.into(),
            reason: "expected AF_INET or AF_INET6".into(),
        })),
    }
}

/// The addresses usable for the bootstrap among `all`, best first.
pub fn choose(all: &[Iface], filter: Option<&IfFilter>, family: Option<Family>) -> Vec<Iface> {
    let fam_ok = |a: &IpAddr| match family {
        Some(Family::V4) => a.is_ipv4(),
        Some(Family::V6) => a.is_ipv6(),
        None => true,
    };
    let usable = |i: &&Iface| {
        fam_ok(&i.addr)
            && !i.addr.is_unspecified()
            && !matches!(i.addr, IpAddr::V6(v6) if v6.is_unicast_link_local())
    };
    let mut v: Vec<Iface> = match filter {
        Some(f) => all
            .iter()
            .filter(usable)
            .filter(|i| f.matches(&i.name))
            .cloned()
            .collect(),
        None => all
            .iter()
            .filter(usable)
            .filter(|i| {
                !["docker", "virbr", "veth", "br-"]
                    .iter()
                    .any(|p| i.name.starts_with(p))
            })
            .cloned()
            .collect(),
    };
    // Stable: InfiniBand first, loopback last, IPv4 before IPv6.
    v.sort_by_key(|i| {
        let class = if i.name.starts_with("ib") {
            0
        } else if i.addr.is_loopback() {
            2
        } else {
            1
        };
        (class, i.addr.is_ipv6())
    });
    v
}

/// This machine's interface addresses.
pub fn list() -> Vec<Iface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its name is a NUL-terminated string and its address,
        // when not null, a sockaddr of the family it names.
        unsafe {
            let ifa = &*p;
            let addr = ifa.ifa_addr;
            if !addr.is_null() {
                let name = std::ffi::CStr::from_ptr(ifa.ifa_name)
                    .to_string_lossy()
                    .into_owned();
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(addr as *const libc::sockaddr_in);
                        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                        out.push(Iface {
                            name,
                            addr: IpAddr::V4(ip),
                        });
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr as *const libc::sockaddr_in6);
                        let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                        out.push(Iface {
                            name,
                            addr: IpAddr::V6(ip),
                        });
                    }
                    _ => {}
                }
            }
            p = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Which interface the bootstrap listens on: `NCCL_SOCKET_IFNAME`'s
/// filter (`None`: any, best first) and `NCCL_SOCKET_FAMILY` (`None`:
/// either), as the facade read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IfaceSettings {
    /// The filter as written (`eth0`, `^docker`, `=ib0`), kept for messages.
    pub ifname: Option<String>,
    pub family: Option<Family>,
}

impl IfaceSettings {
    /// The settings from the two variables' values (unset: `None`).
    pub fn parse(
        ifname: Option<&str>,
        family: Option<&str>,
    ) -> Result<IfaceSettings, BootstrapError> {
        Ok(IfaceSettings {
            ifname: ifname.filter(|s| !s.trim().is_empty()).map(str::to_string),
            family: parse_family(family.unwrap_or_default())?,
        })
    }
}

/// The address to listen on, as `s` chooses it.
pub fn local_addr(s: &IfaceSettings) -> Result<Iface, BootstrapError> {
    let filter = s.ifname.as_deref().map(IfFilter::parse);
    let all = list();
    choose(&all, filter.as_ref(), s.family)
        .into_iter()
        .next()
        .ok_or_else(|| {
            BootstrapError::NoInterface(format!(
                "none of {:?} matches NCCL_SOCKET_IFNAME={:?} NCCL_SOCKET_FAMILY={:?}",
                all.iter().map(|i| &i.name).collect::<Vec<_>>(),
                s.ifname.as_deref().unwrap_or_default(),
                s.family
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs() -> Vec<Iface> {
        [
            ("lo", "127.0.0.1"),
            ("eth0", "10.0.0.2"),
            ("docker0", "172.17.0.1"),
            ("ib0", "192.168.1.2"),
            ("eth0", "fd00::2"),
            ("eth1", "fe80::1"),
        ]
        .iter()
        .map(|(n, a)| Iface {
            name: n.to_string(),
            addr: a.parse().unwrap(),
        })
        .collect()
    }

    fn names(v: &[Iface]) -> Vec<String> {
        v.iter().map(|i| format!("{}={}", i.name, i.addr)).collect()
    }

    #[test]
    fn default_order_is_ib_then_others_then_loopback() {
        let v = choose(&ifs(), None, None);
        assert_eq!(
            names(&v),
            [
                "ib0=192.168.1.2",
                "eth0=10.0.0.2",
                "eth0=fd00::2",
                "lo=127.0.0.1"
            ]
        );
    }

    #[test]
    fn ifname_prefix_exclude_exact_and_family() {
        let f = IfFilter::parse("eth");
        assert_eq!(
            names(&choose(&ifs(), Some(&f), Some(Family::V6))),
            ["eth0=fd00::2"]
        );
        let f = IfFilter::parse("^eth,ib");
        assert_eq!(
            names(&choose(&ifs(), Some(&f), Some(Family::V4))),
            ["docker0=172.17.0.1", "lo=127.0.0.1"]
        );
        let f = IfFilter::parse("=eth");
        assert!(choose(&ifs(), Some(&f), None).is_empty());
        let f = IfFilter::parse("=lo");
        assert_eq!(names(&choose(&ifs(), Some(&f), None)), ["lo=127.0.0.1"]);
        assert!(parse_family("AF_UNIX").is_err());
    }

    #[test]
    fn this_machine_has_a_loopback() {
        assert!(list().iter().any(|i| i.addr.is_loopback()));
    }
}
