//! The address policy of OAuth requests made through this crate's own HTTP
//! client (the one that signs DPoP proofs), the same as rmcp applies to its
//! own: a host named by discovered metadata may resolve to any public
//! address; to a loopback or private address only when the resource URL
//! itself names one of that class (or private addresses are allowed);
//! never to a link-local (cloud instance metadata), unspecified, broadcast,
//! multicast or reserved address. Resolved addresses are filtered where
//! reqwest connects, so a name cannot be rebound between check and use.
//! Hosts of proxies configured through the environment are not filtered (the
//! proxy resolves the target).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs},
    sync::Arc,
};

use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
};
use tracing::warn;
use url::Host;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Public,
    Loopback,
    Private,
    Blocked,
}

fn disallowed_v4(addr: Ipv4Addr) -> bool {
    let o = addr.octets();
    addr.is_private()
        || addr.is_loopback()
        || addr.is_link_local()
        || addr.is_broadcast()
        || addr.is_unspecified()
        || addr.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (64..=127).contains(&o[1]))
        || (o[0] == 198 && matches!(o[1], 18 | 19))
}

/// The IPv4 address inside IPv4-mapped, IPv4-compatible, NAT64 and 6to4
/// addresses.
fn embedded_v4(addr: Ipv6Addr) -> Option<Ipv4Addr> {
    let [a, b, c, d, e, f, g, h] = addr.segments();
    let low = Ipv4Addr::from((u32::from(g) << 16) | u32::from(h));
    match [a, b, c, d, e, f] {
        [0, 0, 0, 0, 0, 0xffff] | [0x64, 0xff9b, 0, 0, 0, 0] => Some(low),
        [0, 0, 0, 0, 0, 0] if !addr.is_loopback() && !addr.is_unspecified() => Some(low),
        [0x2002, ..] => Some(Ipv4Addr::from((u32::from(b) << 16) | u32::from(c))),
        _ => None,
    }
}

fn class(addr: IpAddr) -> Class {
    let addr = match addr {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match addr {
        IpAddr::V4(v4) if !disallowed_v4(v4) => Class::Public,
        IpAddr::V4(v4) if v4.is_loopback() => Class::Loopback,
        IpAddr::V4(v4)
            if v4.is_private()
                || (v4.octets()[0] == 100 && (64..=127).contains(&v4.octets()[1])) =>
        {
            Class::Private
        }
        IpAddr::V4(_) => Class::Blocked,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if v6.is_loopback() {
                Class::Loopback
            } else if (s[0] & 0xfe00) == 0xfc00 {
                Class::Private
            } else if v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xffc0) == 0xfe80
                || s[..2] == [0x2001, 0]
                || s[..3] == [0x64, 0xff9b, 1]
            {
                Class::Blocked
            } else {
                Class::Public
            }
        }
    }
}

/// Which resolved addresses OAuth requests of one resource may reach.
#[derive(Debug, Clone)]
pub(crate) struct AddressPolicy {
    base_ip: Option<IpAddr>,
    allowed: Vec<Class>,
    unfiltered_hosts: Vec<String>,
}

fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        Host::Domain(_) => None,
    }
}

fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl AddressPolicy {
    /// The policy for OAuth requests of the resource at `resource`.
    pub(crate) fn new(resource: &Url, allow_private: bool) -> Self {
        let mut allowed = match resource.host() {
            Some(Host::Ipv4(v4)) => vec![class(IpAddr::V4(v4))],
            Some(Host::Ipv6(v6)) => vec![class(IpAddr::V6(v6))],
            Some(Host::Domain(d)) => {
                let d = normalize(d);
                if d == "localhost" || d.ends_with(".localhost") {
                    vec![Class::Loopback]
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        };
        if allow_private {
            allowed.push(Class::Private);
        }
        let unfiltered_hosts = [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .filter_map(|proxy| {
            let proxy = if proxy.contains("://") {
                proxy
            } else {
                format!("http://{proxy}")
            };
            Url::parse(&proxy).ok()?.host_str().map(normalize)
        })
        .collect();
        AddressPolicy {
            base_ip: literal_ip(resource),
            allowed,
            unfiltered_hosts,
        }
    }

    fn allows(&self, addr: IpAddr) -> bool {
        match class(addr) {
            Class::Public => true,
            Class::Blocked => false,
            c => self.allowed.contains(&c),
        }
    }

    /// Whether a request may go to `url` (checked for IP-literal hosts, which
    /// reqwest connects to without resolving; names are filtered when they
    /// resolve).
    pub(crate) fn allows_url(&self, url: &Url) -> bool {
        match literal_ip(url) {
            Some(ip) => self.base_ip == Some(ip) || self.allows(ip),
            None => true,
        }
    }
}

/// The resolver that applies an [`AddressPolicy`] to every name reqwest
/// resolves.
#[derive(Debug, Clone)]
pub(crate) struct PolicyResolver(pub(crate) Arc<AddressPolicy>);

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = normalize(name.as_str());
            let lookup = host.clone();
            let resolved: Vec<SocketAddr> =
                tokio::task::spawn_blocking(move || (lookup.as_str(), 0).to_socket_addrs())
                    .await??
                    .collect();
            if policy.unfiltered_hosts.contains(&host) {
                return Ok(Box::new(resolved.into_iter()) as Addrs);
            }
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| policy.allows(a.ip()))
                .collect();
            if allowed.is_empty() {
                warn!(host = %host, "no resolved address of this host is allowed for OAuth requests of this resource");
                return Err(format!(
                    "no address of `{host}` is allowed for OAuth requests from this resource"
                )
                .into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn classes_follow_rmcps_policy() {
        assert_eq!(class(ip("93.184.216.34")), Class::Public);
        assert_eq!(class(ip("127.0.0.1")), Class::Loopback);
        assert_eq!(class(ip("::ffff:127.0.0.1")), Class::Loopback);
        assert_eq!(class(ip("10.0.0.9")), Class::Private);
        assert_eq!(class(ip("fd00::1")), Class::Private);
        assert_eq!(class(ip("169.254.169.254")), Class::Blocked);
        assert_eq!(class(ip("fe80::1")), Class::Blocked);
        assert_eq!(class(ip("0.0.0.0")), Class::Blocked);
        assert_eq!(class(ip("64:ff9b::a9fe:a9fe")), Class::Blocked);
        assert_eq!(class(ip("2606:4700::1111")), Class::Public);
    }

    #[test]
    fn a_public_resource_reaches_no_internal_address() {
        let public = AddressPolicy::new(&Url::parse("https://mcp.example.com/mcp").unwrap(), false);
        assert!(public.allows(ip("93.184.216.34")));
        assert!(!public.allows(ip("127.0.0.1")));
        assert!(!public.allows(ip("10.0.0.9")));
        assert!(!public.allows_url(&Url::parse("http://169.254.169.254/token").unwrap()));
        let corporate =
            AddressPolicy::new(&Url::parse("https://mcp.example.com/mcp").unwrap(), true);
        assert!(corporate.allows(ip("10.0.0.9")));
        assert!(!corporate.allows(ip("127.0.0.1")));
        let local = AddressPolicy::new(&Url::parse("http://localhost:3000/mcp").unwrap(), false);
        assert!(local.allows(ip("127.0.0.1")));
        assert!(!local.allows(ip("169.254.169.254")));
    }
}
