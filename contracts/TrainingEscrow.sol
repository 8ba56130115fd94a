// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title TrainingEscrow
/// @notice Holds a coordinator's native-ETH budget for one federated training and pays
///         workers per accepted checkpoint. Each worker has a slot capped at the amount the
///         coordinator committed when opening; whatever is not released can be refunded.
/// @dev Payments are pushed with a gas-capped call; a recipient that reverts is credited
///      in `owed` instead, so one bad worker cannot block a batch. Later versions add
///      ERC-20 budgets, slot replacement, deadlines and slashing behind `_pay`.
contract TrainingEscrow {
    struct Training {
        address coordinator;
        bool closed;
        uint256 deposited;
        uint256 paid;
        uint256 refunded;
    }

    struct Slot {
        uint256 amount;
        uint256 paid;
    }

    /// @dev Enough for a contract wallet's receive hook (proxy + event), small enough that a
    ///      hostile receiver cannot burn the whole batch's gas.
    uint256 public constant PUSH_GAS = 30_000;

    mapping(bytes32 => Training) private _trainings;
    mapping(bytes32 => mapping(address => Slot)) private _slots;
    /// @notice Funds that could not be pushed; the recipient pulls them with `withdraw`.
    mapping(address => uint256) public owed;

    uint256 private _lock = 1;

    event TrainingOpened(bytes32 indexed trainingId, address indexed coordinator, uint256 deposit);
    event SlotOpened(bytes32 indexed trainingId, address indexed worker, uint256 amount);
    event Released(bytes32 indexed trainingId, address indexed worker, uint256 amount, bytes32 resultHash);
    event PaymentDeferred(bytes32 indexed trainingId, address indexed to, uint256 amount);
    event Refunded(bytes32 indexed trainingId, address indexed to, uint256 amount);
    event Withdrawn(address indexed to, uint256 amount);

    error TrainingExists(bytes32 trainingId);
    error UnknownTraining(bytes32 trainingId);
    error NotCoordinator(bytes32 trainingId, address caller);
    error TrainingClosed(bytes32 trainingId);
    error LengthMismatch();
    error NoWorkers();
    error ZeroAddress();
    error ZeroAmount(address worker);
    error DuplicateWorker(address worker);
    error DepositMismatch(uint256 expected, uint256 sent);
    error NotAWorker(bytes32 trainingId, address worker);
    error OverRelease(address worker, uint256 remaining, uint256 requested);
    error NothingOwed(address account);
    error TransferFailed(address to, uint256 amount);
    error Reentrancy();

    modifier nonReentrant() {
        if (_lock != 1) revert Reentrancy();
        _lock = 2;
        _;
        _lock = 1;
    }

    modifier onlyCoordinator(bytes32 trainingId) {
        Training storage t = _trainings[trainingId];
        if (t.coordinator == address(0)) revert UnknownTraining(trainingId);
        if (t.coordinator != msg.sender) revert NotCoordinator(trainingId, msg.sender);
        if (t.closed) revert TrainingClosed(trainingId);
        _;
    }

    /// @notice Open a training with one capped slot per worker; msg.value must fund every slot.
    function open(bytes32 trainingId, address[] calldata workers, uint256[] calldata amounts)
        external
        payable
        nonReentrant
    {
        if (_trainings[trainingId].coordinator != address(0)) revert TrainingExists(trainingId);
        if (workers.length != amounts.length) revert LengthMismatch();
        if (workers.length == 0) revert NoWorkers();

        uint256 total;
        for (uint256 i; i < workers.length; ++i) {
            address worker = workers[i];
            uint256 amount = amounts[i];
            if (worker == address(0)) revert ZeroAddress();
            if (amount == 0) revert ZeroAmount(worker);
            Slot storage s = _slots[trainingId][worker];
            // A non-zero amount marks a slot as taken, so this also catches duplicates.
            if (s.amount != 0) revert DuplicateWorker(worker);
            s.amount = amount;
            total += amount;
            emit SlotOpened(trainingId, worker, amount);
        }
        if (msg.value != total) revert DepositMismatch(total, msg.value);

        _trainings[trainingId] = Training({
            coordinator: msg.sender,
            closed: false,
            deposited: msg.value,
            paid: 0,
            refunded: 0
        });
        emit TrainingOpened(trainingId, msg.sender, msg.value);
    }

    /// @notice Pay workers for accepted results; each amount may be a part of the slot's remainder.
    function release(
        bytes32 trainingId,
        address[] calldata workers,
        uint256[] calldata amounts,
        bytes32[] calldata resultHashes
    ) external nonReentrant onlyCoordinator(trainingId) {
        if (workers.length != amounts.length || workers.length != resultHashes.length) {
            revert LengthMismatch();
        }
        if (workers.length == 0) revert NoWorkers();

        // Effects for the whole batch first, then the transfers (checks-effects-interactions).
        uint256 total;
        for (uint256 i; i < workers.length; ++i) {
            address worker = workers[i];
            uint256 amount = amounts[i];
            Slot storage s = _slots[trainingId][worker];
            if (s.amount == 0) revert NotAWorker(trainingId, worker);
            if (amount == 0) revert ZeroAmount(worker);
            uint256 remaining = s.amount - s.paid;
            if (amount > remaining) revert OverRelease(worker, remaining, amount);
            s.paid += amount;
            total += amount;
            emit Released(trainingId, worker, amount, resultHashes[i]);
        }
        _trainings[trainingId].paid += total;

        for (uint256 i; i < workers.length; ++i) {
            _pay(trainingId, workers[i], amounts[i]);
        }
    }

    /// @notice Close the training and return the unreleased budget to the coordinator.
    function refund(bytes32 trainingId) external nonReentrant onlyCoordinator(trainingId) {
        Training storage t = _trainings[trainingId];
        uint256 amount = t.deposited - t.paid;
        t.closed = true;
        t.refunded = amount;
        emit Refunded(trainingId, msg.sender, amount);
        if (amount != 0) _pay(trainingId, msg.sender, amount);
    }

    /// @notice Pull funds whose push failed. Reverts if the transfer fails, keeping the balance.
    function withdraw() external nonReentrant {
        uint256 amount = owed[msg.sender];
        if (amount == 0) revert NothingOwed(msg.sender);
        owed[msg.sender] = 0;
        emit Withdrawn(msg.sender, amount);
        // The caller chose to pull, so it gets all remaining gas.
        (bool ok,) = payable(msg.sender).call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice (coordinator, deposited, paid, refunded, closed) of a training.
    function trainings(bytes32 trainingId)
        external
        view
        returns (address coordinator, uint256 deposited, uint256 paid, uint256 refunded, bool closed)
    {
        Training storage t = _trainings[trainingId];
        return (t.coordinator, t.deposited, t.paid, t.refunded, t.closed);
    }

    /// @notice (amount, paid) of a worker's slot; (0, 0) when the worker has none.
    function slot(bytes32 trainingId, address worker) external view returns (uint256 amount, uint256 paid) {
        Slot storage s = _slots[trainingId][worker];
        return (s.amount, s.paid);
    }

    /// @dev Push with a gas cap and without copying return data (no return-data bomb);
    ///      on failure park the amount in `owed`.
    function _pay(bytes32 trainingId, address to, uint256 amount) private {
        bool ok;
        uint256 gasCap = PUSH_GAS;
        assembly {
            ok := call(gasCap, to, amount, 0, 0, 0, 0)
        }
        if (!ok) {
            owed[to] += amount;
            emit PaymentDeferred(trainingId, to, amount);
        }
    }
}
