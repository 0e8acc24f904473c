//! The unit the per-address caps count. Addresses are grouped the way they are handed out:
//! one host commonly owns a whole IPv6 /64, so counting single IPv6 addresses would be no cap
//! at all, while an IPv4 client seen through an IPv6 socket is still one IPv4 address.

use std::net::{IpAddr, Ipv4Addr};

/// The unit the per-address caps count: one IPv4 address, or one IPv6 /64 network. An IPv4
/// client seen through an IPv6 socket counts as its IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressGroup {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// The upper 64 bits of an IPv6 address.
    V6Net(u64),
}

impl AddressGroup {
    /// The group `ip` belongs to.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => AddressGroup::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressGroup::V4(v4),
                None => AddressGroup::V6Net((u128::from(v6) >> 64) as u64),
            },
        }
    }
}
