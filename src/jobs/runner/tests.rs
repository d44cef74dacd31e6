use super::interleave;
use std::collections::VecDeque;

fn queues(sizes: &[usize]) -> Vec<VecDeque<(usize, usize)>> {
    sizes
        .iter()
        .enumerate()
        .map(|(q, &n)| (0..n).map(|i| (q, i)).collect())
        .collect()
}

#[test]
fn one_of_each_in_turn_each_queue_in_order() {
    let (taken, next, more) = interleave(queues(&[3, 1, 2]), 0, 10);
    assert_eq!(taken, [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]);
    assert!(!more);
    assert_eq!(next, 1);
}

#[test]
fn a_job_left_out_of_one_look_comes_first_in_the_next() {
    // 300 jobs with a backlog each, 100 claims a look: every job gets its first claim
    // within three looks, whatever the others' backlogs.
    let mut state = queues(&[5; 300]);
    let mut first = 0;
    let mut served_at = vec![None; 300];
    for look in 0..3 {
        let (taken, next, more) = interleave(state.clone(), first, 100);
        assert_eq!(taken.len(), 100);
        assert!(more);
        for (q, _) in &taken {
            served_at[*q].get_or_insert(look);
            state[*q].pop_front();
        }
        first = next;
    }
    assert!(served_at.iter().all(Option::is_some), "{served_at:?}");
}

#[test]
fn nothing_to_take() {
    assert_eq!(
        interleave(Vec::<VecDeque<u8>>::new(), 7, 100),
        (vec![], 0, false)
    );
    assert_eq!(interleave(queues(&[0, 0]), 1, 100), (vec![], 1, false));
}
