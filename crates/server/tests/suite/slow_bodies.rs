//! Slow request bodies cannot switch the decision API off: bodies below the minimum rate end
//! with 408 after their grace period, and under pressure each address has a bounded number of
//! bodies in progress. Real listeners on loopback, attackers on 127.0.0.2-6.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::listener::{
    self, CHECK, connect_from, metrics_text, rejected, request, serve, turn,
};
use sluice_server::limits::ConnectionLimits;
use tokio::io::AsyncWriteExt;

/// Keeps `per_address` connections from `from` each sending a request head and then one byte
/// of body a second; a connection the server ends is replaced after a short pause (the
/// attacker reconnects). Stops when `stop` is set.
async fn trickle_from(
    from: IpAddr,
    to: SocketAddr,
    per_address: usize,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) {
    let mut tasks = Vec::new();
    for _ in 0..per_address {
        let stop = Arc::clone(&stop);
        let opened = Arc::clone(&opened);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut c) = connect_from(from, to).await {
                    opened.fetch_add(1, Ordering::Relaxed);
                    let head = "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n{";
                    if c.write_all(head.as_bytes()).await.is_ok() {
                        while !stop.load(Ordering::Relaxed) && c.write_all(b" ").await.is_ok() {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// The finding: 1,100 slow bodies from 5 addresses (220 each, under the per-address cap)
/// against a server with a descriptor limit of 1,024 made `/v1/check` answer 503 for 30 s
/// per wave, and with the attacker reconnecting 22 of 23 probes failed. Scaled by 1/4 here:
/// a cap of 208 connections (1,024 less the headroom and reserve, /4) and 275 slow bodies
/// from 127.0.0.2-6. At least 95 % of another client's checks, each on a fresh connection,
/// are answered 200 within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_from_five_addresses_leave_other_checks_answered() {
    let _turn = turn().await;
    const ADDRESSES: u8 = 5;
    const PER_ADDRESS: usize = 55;
    const PROBES: usize = 70;
    let s = serve(Some(ConnectionLimits {
        max_connections: 208,
        reserve: 16,
        ..ConnectionLimits::default()
    }))
    .await;
    let addr = s.addrs.http;
    let before = metrics_text(addr).await;
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..ADDRESSES)
        .map(|i| {
            let from: IpAddr = format!("127.0.0.{}", 2 + i).parse().unwrap();
            tokio::spawn(trickle_from(
                from,
                addr,
                PER_ADDRESS,
                Arc::clone(&stop),
                Arc::clone(&opened),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Probes every 100 ms for 7 s: through the grace period and the first 408s.
    let probe_from: IpAddr = "127.0.0.1".parse().unwrap();
    let mut answered = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..PROBES {
        let started = Instant::now();
        let probe = async {
            let mut c = connect_from(probe_from, addr).await.ok()?;
            request(&mut c, "POST", "/v1/check", CHECK, true).await.ok()
        };
        if let Ok(Some(a)) = tokio::time::timeout(Duration::from_secs(1), probe).await
            && a.status == 200
        {
            answered += 1;
            slowest = slowest.max(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(started.elapsed())).await;
    }
    let text = metrics_text(addr).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = tokio::time::timeout(Duration::from_secs(5), a).await;
    }
    let too_slow = rejected(&text, "body_too_slow") - rejected(&before, "body_too_slow");
    let capped = rejected(&text, "bodies_per_ip") - rejected(&before, "bodies_per_ip");
    eprintln!(
        "{answered}/{PROBES} probes answered 200 within 1 s (slowest {slowest:?}); attacker \
         opened {} connections; {too_slow} bodies ended 408 for their rate, {capped} refused \
         by max_bodies_per_ip",
        opened.load(Ordering::Relaxed)
    );
    assert!(
        answered * 100 >= PROBES * 95,
        "{answered} of {PROBES} checks answered within 1 s"
    );
    assert!(
        too_slow >= 1.0,
        "slow bodies end with 408 after the grace period"
    );
    assert!(
        capped >= 1.0,
        "bodies beyond max_bodies_per_ip are refused under pressure"
    );
    s.stop().await;
}

/// A body below `min_body_rate` ends with 408 and a close once `body_rate_grace` has passed,
/// long before `body_timeout`.
#[tokio::test]
async fn a_body_below_the_minimum_rate_ends_with_408_after_the_grace() {
    let _turn = turn().await;
    let s = serve(Some(ConnectionLimits {
        body_rate_grace: Duration::from_secs(1),
        ..ConnectionLimits::default()
    }))
    .await;
    let mut c = tokio::net::TcpStream::connect(s.addrs.http).await.unwrap();
    c.write_all(b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
        .await
        .unwrap();
    let started = Instant::now();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if c.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), trickle).await;
    let answer = listener::read_answer(&mut c).await.expect("an answer");
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(answer.body.contains("min_body_rate"), "{}", answer.body);
    assert!(started.elapsed() < Duration::from_secs(5));
    s.stop().await;
}
